"""What the service's processes hold before, right after and a while after a load (issue 34 item 13).

    python bench/service_memory.py [-m MODEL] [--malformed 5000] [--clients 32] [--load-s 120] [--idle-s 60]

Starts genie-daemon on MODEL (default: the default model, as a new user runs it), measures each process's
resident set (VmRSS of the daemon, its worker and its KV store, from /proc) once it is ready and idle, then
sends --malformed malformed HTTP requests one after another, then runs --clients streaming clients (each a
loop of /api/generate or /api/chat with prompts of varied length) for --load-s seconds, measures again,
waits --idle-s seconds and measures a last time. The table shows the three and the last against the first;
the service should give back what a load took (within 10 % of before).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the a kitchen light is on off turn please what time weather today tomorrow music play stop".split()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def malformed(n: int, rng: random.Random) -> list[tuple[str, str, bytes]]:
    """n requests each wrong in one way: (method, path, body)."""
    paths = ["/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/api/show", "/api/pull"]
    out = []
    for i in range(n):
        path = rng.choice(paths)
        kind = i % 8
        if i % 100 == 7:  # past http_max_body_mb: refused before it is read
            out.append(("POST", path, b'{"model": "' + b"x" * (9 << 20) + b'"}'))
            continue
        if kind == 0:
            body = b"\xff" + rng.randbytes(rng.randrange(1, 300))
        elif kind == 1:
            body = json.dumps([1, {"model": "x"}]).encode()
        elif kind == 2:
            full = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi" * rng.randrange(200)}]})
            body = full[: rng.randrange(1, len(full) - 1)].encode()
        elif kind == 3:
            body = json.dumps({"model": f"nope-{i}", "prompt": "x" * rng.randrange(2000)}).encode()
        elif kind == 4:
            body = json.dumps({"model": None, "messages": "no"}).encode()
        elif kind == 5:
            body = json.dumps({"messages": [{"role": "wizard", "content": 3}], "options": {"top_k": 1.5}}).encode()
        elif kind == 6:
            body = b'{"model": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        else:
            out.append((rng.choice(["GET", "PUT", "DELETE"]), rng.choice(paths + ["/nothing"]), b""))
            continue
        out.append(("POST", path, body))
    return out


def send_malformed(port: int, n: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for method, path, body in malformed(n, random.Random(13)):
        try:
            conn.request(method, path, body=body or None, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
        except (ConnectionError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.close()
    return statuses


async def one_client(session: aiohttp.ClientSession, url: str, model: str, seed: int, until: float) -> dict[str, int]:
    rng = random.Random(seed)
    seen = {"ok": 0, "refused": 0, "tokens": 0}
    while time.monotonic() < until:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 400)))
        options = {"num_predict": rng.randrange(8, 96), "temperature": rng.choice([0.0, 0.8])}
        if rng.random() < 0.5:
            path, body = "/api/generate", {"model": model, "prompt": words, "options": options}
        else:
            path, body = "/api/chat", {"model": model, "messages": [{"role": "user", "content": words}]}
            body["options"] = options
        async with session.post(url + path, json=body) as resp:
            if resp.status != 200:
                await resp.read()
                seen["refused"] += 1
                await asyncio.sleep(0.05)
                continue
            async for line in resp.content:
                if line.strip():
                    seen["tokens"] += 1
            seen["ok"] += 1
    return seen


async def streaming_load(port: int, model: str, clients: int, seconds: float) -> dict[str, int]:
    url = f"http://127.0.0.1:{port}"
    until = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        results = await asyncio.gather(*(one_client(session, url, model, i, until) for i in range(clients)))
    return {k: sum(r[k] for r in results) for k in results[0]}


def status(sock_dir: Path) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "genie_daemon.ctl", "--socket-dir", str(sock_dir), "--json", "status"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    return json.loads(r.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None, help="(default: the daemon's default model)")
    p.add_argument("--malformed", type=int, default=5000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--load-s", type=float, default=120.0)
    p.add_argument("--idle-s", type=float, default=60.0)
    p.add_argument("--daemon-arg", action="append", default=[], help="more genie-daemon arguments")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genie-mem-"))
    sock_dir, port = tmp / "run", free_port()
    cmd = [sys.executable, "-m", "genie_daemon", "--socket-dir", str(sock_dir), "--http-port", str(port)]
    cmd += ["--kv-cache-dir", str(tmp / "kv"), *args.daemon_arg] + (["-m", args.model] if args.model else [])
    log = open(tmp / "daemon.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=log, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                s = status(sock_dir)
                if s.get("ready"):
                    break
            except (ValueError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the daemon did not become ready: see {tmp / 'daemon.log'}")
            time.sleep(0.5)
        model = s["loaded_model"]
        pids = {"daemon": proc.pid, "worker": s["worker_pid"], "kv store": s["kv_store_pid"]}
        time.sleep(5)  # settled: the first status polls, the store's first scan
        rows = {name: [rss_mb(pid)] for name, pid in pids.items()}
        t0 = time.monotonic()
        statuses = send_malformed(port, args.malformed)
        print(f"{args.malformed} malformed requests in {time.monotonic() - t0:.1f} s: statuses {statuses}")
        seen = asyncio.run(streaming_load(port, model, args.clients, args.load_s))
        print(f"{args.clients} streaming clients for {args.load_s:.0f} s: {seen}")
        after = status(sock_dir)
        assert after["worker_pid"] == pids["worker"], "the worker was restarted during the load"
        for name, pid in pids.items():
            rows[name].append(rss_mb(pid))
        time.sleep(args.idle_s)
        for name, pid in pids.items():
            rows[name].append(rss_mb(pid))
        print(f"\nmodel {model}; RSS MB (VmRSS)")
        later = f"{args.idle_s:.0f} s later"
        print(f"{'process':<10} {'before':>8} {'after load':>11} {later:>11} {'later/before':>13}")
        for name, (before, loaded, later) in rows.items():
            print(f"{name:<10} {before:>8.1f} {loaded:>11.1f} {later:>11.1f} {later / before:>12.2f}x")
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
