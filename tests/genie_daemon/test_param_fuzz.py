"""Every sampling parameter with extreme values, through ZMQ and both HTTP APIs, on the real daemon: each
request gets a normal answer or a clear refusal (bad_request / 400), and the worker never restarts.
`repeat_penalty: 1e-300` with temperature > 0 once killed the worker (NaN probabilities)."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from genie_protocol.client import GenieClient
from genie_protocol.errors import ProtocolError
from genie_protocol.messages import Delta, Done, Error
from testkit.tiny_models import write_tiny_model
from tests.child_env import child_env
from tests.genie_daemon.test_daemon import ctl
from tests.genie_daemon.test_http_live import free_port

ROOT = Path(__file__).resolve().parents[2]
EXTREMES = [0, -1, 1, 0.5, -0.0, 1e-300, -1e-300, 1e300, -1e300, float("inf"), float("-inf"), float("nan")]
EXTREMES += [2**31, -(2**31), 2**62, -(2**62), 2**63 - 1, 10**30, True, "1", None]
PARAMS = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed", "max_tokens"]
OLLAMA = {"max_tokens": "num_predict", "repeat_last_n": "repeat_last_n"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    model = tmp / "tiny.gguf"
    write_tiny_model("llama", model)
    port = free_port()
    cmd = [sys.executable, "-m", "genie_daemon", "-m", str(model), "--ctx", "256", "--socket-dir", str(tmp / "run")]
    cmd += ["--kv-cache-dir", str(tmp / "kv"), "--http-port", str(port), "--max-tokens-default", "4"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = ctl(tmp / "run", "--json", "status")
        if r.returncode == 0 and json.loads(r.stdout)["ready"]:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError(proc.stderr.read() if proc.stderr else "")
    yield f"ipc://{tmp}/run/genie.sock", f"http://127.0.0.1:{port}", tmp / "run"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    finally:
        proc.kill()


def cases(n: int, seed: int) -> list[dict]:
    """Each parameter at each extreme once (with a hot temperature, where NaN probabilities came from),
    then random mixes of several."""
    out = [
        {name: value, "temperature": 0.9} if name != "temperature" else {name: value}
        for name in PARAMS
        for value in EXTREMES
    ]
    rng = random.Random(seed)
    out += [{name: rng.choice(EXTREMES) for name in rng.sample(PARAMS, 3)} for _ in range(n)]
    return out


def bounded(params: dict) -> dict:
    """max_tokens kept small where it is valid, so a case that is served ends quickly."""
    p = dict(params)
    if isinstance(p.get("max_tokens"), int) and not isinstance(p["max_tokens"], bool) and p["max_tokens"] > 4:
        p["max_tokens"] = 4
    return p


def post(url: str, body: dict) -> int:
    data = json.dumps(body, allow_nan=True).encode()  # NaN and Infinity as Python's json writes them
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def test_extreme_sampling_parameters_never_restart_the_worker(served):
    endpoint, url, sock_dir = served
    params = [bounded(p) for p in cases(40, seed=16)]

    async def zmq_all() -> list:
        ends = []
        async with GenieClient(endpoint, timeout_s=60) as client:
            for p in params:
                end = None
                try:
                    async for ev in client.generate(prompt="hi", params=p):
                        if not isinstance(ev, Delta):
                            end = ev
                except ProtocolError as e:  # msgpack cannot carry it (an integer beyond 64 bits): never sent
                    assert "cannot be encoded" in e.message
                    continue
                ends.append((p, end))
        return ends

    for p, end in asyncio.run(zmq_all()):
        assert isinstance(end, Done) or (isinstance(end, Error) and end.code in ("bad_message", "bad_request")), (
            p,
            end,
        )
    for p in params:
        options = {OLLAMA.get(k, k): v for k, v in p.items()}
        assert post(url + "/api/generate", {"model": "tiny", "prompt": "hi", "stream": False, "options": options}) in (
            200,
            400,
        ), options
        body = {
            "model": "tiny",
            "prompt": "hi",
            **{k: v for k, v in p.items() if k in ("temperature", "top_p", "seed", "max_tokens")},
        }
        assert post(url + "/v1/completions", body) in (200, 400), body
    status = json.loads(ctl(sock_dir, "--json", "status").stdout)
    assert status["worker_restarts"] == 0 and status["ready"], status
