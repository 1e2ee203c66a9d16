"""`genie-ctl`: ask the running daemon — status, health, metrics, a test generation, load or pull a model."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import zmq

from genie_common import __version__
from genie_common.config import DaemonConfig
from genie_common.models.catalogue import CATALOGUE
from genie_protocol.client import GenieClient
from genie_protocol.codec import decode, encode
from genie_protocol.errors import ProtocolError
from genie_protocol.messages import (
    Cancel,
    Delta,
    Done,
    Error,
    Health,
    KvClear,
    KvEvict,
    KvList,
    Load,
    Message,
    Metrics,
    Pull,
    Reply,
    Status,
    Stop,
    Unload,
)

TIMEOUT_S = 3.0
STOP_WAIT_S = 60.0  # a stop ends the turns, then stops the worker and the KV store (up to 10 s each if hung)
PULL_SILENCE_S = 30.0  # a pull's daemon sends progress at least every 5 s (PULL_KEEPALIVE_S): silence is death


class NotRunning(Exception):
    pass


def _admin_call(endpoint: str, msg: Message) -> Message:
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None
    if path is not None:
        _check_listening(path)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode(msg))
        if not sock.poll(int(TIMEOUT_S * 1000)):
            raise NotRunning(f"no answer from {endpoint} within {TIMEOUT_S:.0f} s")
        reply, _ = decode(sock.recv_multipart())
        return reply
    except ProtocolError as e:
        raise NotRunning(f"{endpoint} answered something that is not genie's protocol: {e.message}") from None
    finally:
        sock.close()
        ctx.term()


def _check_listening(path: str) -> None:
    """NotRunning at once for a missing socket file, or one no process listens on (a daemon that was
    killed leaves its file): ZeroMQ would wait out the whole timeout on it."""
    if not os.path.exists(path):
        raise NotRunning(f"no daemon socket at {path}")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        raise NotRunning(f"no daemon listens at {path} (a socket file left by one that stopped)") from None
    except OSError:
        pass  # not ours to judge (permissions, a path too long for AF_UNIX): ZeroMQ will say
    finally:
        probe.close()


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _print_table(data: dict[str, Any]) -> None:
    flat = _flatten(data)
    width = max(len(k) for k in flat)
    for key, value in flat.items():
        print(f"{key.ljust(width)}  {value}")


def _readable_status(data: dict[str, Any]) -> dict[str, Any]:
    """STATUS for people: the worker's slots on one line, in use / total."""
    slots = data.get("slots")
    if not isinstance(slots, dict):
        return data
    return {**data, "slots": f"{slots.get('in_use')} / {slots.get('total')} in use"}


def _print_entries(entries: list[dict[str, Any]]) -> None:
    if not entries:
        print("no saved conversations")
        return
    now = time.time_ns()
    print(f"{'id':<40} {'conv id':<24} {'tokens':>7} {'MB':>8} {'dtype':<5} {'model':<12} {'last used':>10}")
    for e in entries:
        age = max(0.0, (now - int(e["last_used_ns"])) / 1e9)
        print(
            f"{e['id']:<40} {e['conv_id'] or '-':<24} {e['tokens']:>7} {e['bytes'] / 1e6:>8.2f} "
            f"{e['dtype']:<5} {e['model']:<12} {age:>8.0f} s"
        )


async def _generate(endpoint: str, prompt: str, max_tokens: int) -> tuple[str, Message]:
    text = []
    async with GenieClient(endpoint, timeout_s=120) as client:
        async for ev in client.generate(prompt=prompt, params={"max_tokens": max_tokens}):
            if isinstance(ev, Delta):
                text.append(ev.text)
                print(ev.text, end="", flush=True)
            else:
                return "".join(text), ev
    raise AssertionError("unreachable")


def _load(config: DaemonConfig, model: str, as_json: bool, timeout_s: float = 600.0) -> int:
    reply = _admin_call(config.admin_endpoint, Load(request_id="ctl", model=model))
    if isinstance(reply, Error):
        print(f"genie-ctl: error: {reply.code}: {reply.message}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + timeout_s
    time.sleep(0.5)
    while time.monotonic() < deadline:
        status = _admin_call(config.admin_endpoint, Status(request_id="ctl"))
        data = status.data if isinstance(status, Reply) else {}
        if data.get("load_error"):
            print(f"genie-ctl: error: {data['load_error']}", file=sys.stderr)
            return 1
        if data.get("ready"):
            print(json.dumps(data) if as_json else f"serving {data.get('model')}")
            return 0
        time.sleep(0.25)
    print(f"genie-ctl: error: {model!r} was not ready within {timeout_s:.0f} s", file=sys.stderr)
    return 1


def _pull(endpoint: str, source: str, as_json: bool) -> int:
    """PULL through the daemon, into its models directory: progress on stderr (a bar on a terminal, a line
    per step otherwise), the model on stdout. Ctrl-C cancels the pull (a later pull resumes it)."""
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None
    if path is not None:
        _check_listening(path)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)  # the CANCEL of a Ctrl-C still leaves
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode(Pull(request_id="ctl-pull", model=source)))
        try:
            return _follow_pull(sock, endpoint, as_json)
        except KeyboardInterrupt:
            sock.send_multipart(encode(Cancel(request_id="ctl-pull")))
            print("\ngenie-ctl: pull cancelled (pulling it again resumes it)", file=sys.stderr)
            return 130
    finally:
        sock.close()
        ctx.term()


def _follow_pull(sock: zmq.Socket, endpoint: str, as_json: bool) -> int:
    # here, not at the top: they load the GGUF reader, which every other genie-ctl command can do without
    from genie_common.models.progress_bar import ProgressBar
    from genie_common.models.pull import PullProgress

    show = ProgressBar(sys.stderr, sys.stderr.isatty())
    while True:
        if not sock.poll(int(PULL_SILENCE_S * 1000)):
            raise NotRunning(f"the daemon said nothing of the pull for {PULL_SILENCE_S:.0f} s")
        try:
            reply, _ = decode(sock.recv_multipart())
        except ProtocolError as e:
            raise NotRunning(f"{endpoint} answered something that is not genie's protocol: {e.message}") from None
        if isinstance(reply, Error):
            show(PullProgress("failed"))  # a step line: it also ends a progress bar's line
            print(f"genie-ctl: error: {reply.code}: {reply.message}", file=sys.stderr)
            return 1
        if not isinstance(reply, Reply):
            raise NotRunning(f"{endpoint} answered a PULL with {type(reply).__name__.upper()}")
        data = reply.data
        fields = {k: data.get(k) for k in ("total", "completed", "digest")}
        show(PullProgress(str(data.get("status", "")), **fields))
        if data.get("done"):
            model = data.get("model", {})
            if as_json:
                print(json.dumps(model))
            else:
                size_mb = int(model.get("size_bytes", 0)) / 1e6
                print(f"{model.get('name')}: {size_mb:,.1f} MB (genie-ctl load {model.get('name')})")
            return 0


def _stop(endpoint: str, as_json: bool, timeout_s: float = STOP_WAIT_S) -> int:
    """STOP, then waits until the daemon's admin socket is gone: 0 once it is (the daemon shut down, its turns
    cancelled and their KV saved; its process exits a moment later), 1 when it is still there at the deadline."""
    t0 = time.monotonic()
    reply = _admin_call(endpoint, Stop(request_id="ctl-stop"))
    if isinstance(reply, Error):
        print(f"genie-ctl: error: {reply.code}: {reply.message}", file=sys.stderr)
        return 1
    pid = reply.data.get("stopping") if isinstance(reply, Reply) else None
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None
    while time.monotonic() - t0 < timeout_s:
        try:
            if path is None:  # no socket file to watch: the daemon answers until it is gone
                _admin_call(endpoint, Status(request_id="ctl-stop"))
            else:
                _check_listening(path)
        except NotRunning:
            took_s = time.monotonic() - t0
            print(
                json.dumps({"stopped": True, "pid": pid, "took_s": round(took_s, 2)})
                if as_json
                else f"stopped genie-daemon (pid {pid}) in {took_s:.1f} s"
            )
            return 0
        time.sleep(0.1)
    print(f"genie-ctl: error: the daemon (pid {pid}) was still running {timeout_s:.0f} s after STOP", file=sys.stderr)
    return 1


def _wait_ready(endpoint: str, wait_s: float) -> int:
    """Polls STATUS until the daemon serves: 0, or 1 when its model failed to load (never retried), or 2
    at the deadline. Says on stderr what it waits for, once each time that changes: a first start
    (a packaged model assembled, then loaded) can take minutes."""
    deadline = time.monotonic() + wait_s
    said = ""
    while True:
        try:
            reply = _admin_call(endpoint, Status(request_id="ctl-wait"))
        except NotRunning:
            waiting_for = f"waiting for the daemon at {endpoint}"
        else:
            data = reply.data if isinstance(reply, Reply) else {}
            if data.get("ready"):
                return 0
            if data.get("load_error"):
                print(f"genie-ctl: error: {data['load_error']}", file=sys.stderr)
                return 1
            model, pulling = data.get("loaded_model"), data.get("pulling")
            if pulling:  # auto_pull: the configured model is being fetched first
                waiting_for = f"pulling {model}: {pulling.get('status')}"
            elif model:
                waiting_for = f"the worker is loading {model}"
            else:
                waiting_for = "no model is loaded (genie-ctl load MODEL)"
        if waiting_for != said:
            print(f"genie-ctl: {waiting_for} …", file=sys.stderr)
            said = waiting_for
        if time.monotonic() > deadline:
            print(f"genie-ctl: the daemon was not ready within {wait_s:.0f} s", file=sys.stderr)
            return 2
        time.sleep(0.25)


def _add_global_options(p: argparse.ArgumentParser, with_defaults: bool) -> None:
    """--socket-dir, --json, --wait: on the main parser (with defaults) and again on each command's
    (without: argparse copies a command's defaults over what was given before the command)."""
    d = DaemonConfig()

    def default(value: Any) -> Any:
        return value if with_defaults else argparse.SUPPRESS

    p.add_argument(
        "--socket-dir", default=default(d.socket_dir), help=f"the daemon's socket directory (default: {d.socket_dir})"
    )
    p.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON for scripts (default: readable tables)"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=default(0.0),
        help="wait up to this many seconds for the daemon to be ready (default: 0)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `genie-ctl metrics | head`: the reader left, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


def _main(argv: Sequence[str] | None) -> int:
    p = argparse.ArgumentParser(prog="genie-ctl", description="talk to the running genie daemon")
    p.add_argument("--version", action="version", version=f"genie {__version__}")
    _add_global_options(p, with_defaults=True)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="model, backend, device, load time, uptime, pids, queue, slots, requests served")
    sub.add_parser("health", help="exit code 0 when the daemon can serve, 1 when not")
    sub.add_parser("metrics", help="the counters GET /metrics has: requests by outcome, tokens, timings, KV store")
    load = sub.add_parser("load", help="serve another model (waits until it is ready)")
    load.add_argument("model", help="GGUF path, installed model name or a model of the daemon's models directory")
    pull = sub.add_parser("pull", help="fetch a model into the daemon's models directory (progress on stderr)")
    pull.add_argument(
        "source",
        help=f"a catalogue name ({', '.join(CATALOGUE)}), hf://OWNER/REPO/FILE.gguf or an http(s) URL of a .gguf",
    )

    sub.add_parser("unload", help="stop serving; GENERATE is refused until the next load")
    sub.add_parser(
        "stop", help="stop the daemon as SIGTERM does (turns cancelled, their KV saved) and wait until it has"
    )
    kv = sub.add_parser("kv", help="saved conversations: ls | evict ID | clear")
    kv.add_argument("kv_command", choices=("ls", "evict", "clear"))
    kv.add_argument(
        "entry_id", nargs="?", help="for evict: an id as `kv ls` shows it (c-<conv id>.<tag> or t-<hash>.<tag>)"
    )
    gen = sub.add_parser("generate", help="generate from a prompt through the daemon")
    gen.add_argument("prompt")
    gen.add_argument("-n", "--max-tokens", type=int, default=64, help="(default: %(default)s)")
    for command in sub.choices.values():
        _add_global_options(command, with_defaults=False)
    args = p.parse_args(argv)
    config = DaemonConfig(socket_dir=args.socket_dir)
    if args.wait > 0:  # a daemon just started: its socket appears, then its worker loads the model
        waited = _wait_ready(config.admin_endpoint, args.wait)
        if waited:
            return waited
    try:
        if args.command == "generate":
            text, end = asyncio.run(_generate(config.client_endpoint, args.prompt, args.max_tokens))
            print()
            if isinstance(end, Error):
                print(f"genie-ctl: error: {end.code}: {end.message}", file=sys.stderr)
                return 1
            assert isinstance(end, Done)
            if args.json:
                print(json.dumps({"text": text, "finish_reason": end.finish_reason, "usage": end.usage}))
            return 0
        if args.command == "load":
            return _load(config, args.model, args.json)
        if args.command == "pull":
            return _pull(config.admin_endpoint, args.source, args.json)
        if args.command == "stop":
            return _stop(config.admin_endpoint, args.json)
        if args.command == "unload":
            reply = _admin_call(config.admin_endpoint, Unload(request_id="ctl"))
        elif args.command == "kv":
            if args.kv_command == "evict" and not args.entry_id:
                print("genie-ctl: error: kv evict needs an entry id (see `genie-ctl kv ls`)", file=sys.stderr)
                return 2
            kv_call: Message = {
                "ls": KvList(request_id="ctl"),
                "evict": KvEvict(request_id="ctl", entry_id=args.entry_id or ""),
                "clear": KvClear(request_id="ctl"),
            }[args.kv_command]
            reply = _admin_call(config.admin_endpoint, kv_call)
        else:
            call = {"status": Status, "health": Health, "metrics": Metrics}[args.command]
            reply = _admin_call(config.admin_endpoint, call(request_id="ctl"))
    except NotRunning as e:
        print(f"genie-ctl: the daemon is not running ({e})", file=sys.stderr)
        return 2
    if isinstance(reply, Error):
        print(f"genie-ctl: error: {reply.code}: {reply.message}", file=sys.stderr)
        return 1
    assert isinstance(reply, Reply)
    if args.command == "health":
        healthy = bool(reply.data.get("ready"))
        print(json.dumps({"healthy": healthy}) if args.json else ("healthy" if healthy else "not ready"))
        return 0 if healthy else 1
    if args.json:
        print(json.dumps(reply.data))
    elif args.command == "kv" and args.kv_command == "ls":
        _print_entries(reply.data.get("entries", []))
    elif args.command == "kv" and args.kv_command == "evict" and not reply.data.get("evicted"):
        print(f"no entry {args.entry_id}")
        return 1
    elif args.command == "status":
        _print_table(_readable_status(reply.data))
    else:
        _print_table(reply.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
