"""SIGTERM during a turn, on the real default model: the turn ends cancelled at once, its KV is saved,
the daemon removes its socket files and exits 0, and genie-ctl then says at once that none is running."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

from genie_protocol.client import GenieClient
from genie_protocol.messages import Delta, Done
from tests.genie_daemon.test_daemon import ctl, start_daemon

PROMPT = "Write a long story about a lighthouse keeper and the storms of one winter." * 3


def test_sigterm_mid_answer_cancels_saves_and_cleans_up(tmp_path):
    proc, endpoint = start_daemon(tmp_path, model="gemma3-270m", ctx=2048, backend="numpy", ready_timeout_s=120)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    events: list = []

    async def turn() -> None:
        params = {"temperature": 0.0, "max_tokens": 1500, "ignore_eos": True}
        async with GenieClient(endpoint, timeout_s=60) as client:
            async for ev in client.generate(prompt=PROMPT, params=params, conv_id="porch"):
                events.append(ev)
                if len(events) == 3:  # answering: now stop the daemon
                    proc.send_signal(signal.SIGTERM)

    try:
        asyncio.run(turn())
        proc.communicate(timeout=15)  # a hang guard, not a speed bound
    except BaseException:
        proc.kill()
        raise
    end = events[-1]
    assert isinstance(end, Done) and end.finish_reason == "cancelled", end
    assert all(isinstance(e, Delta) for e in events[:-1])
    assert proc.returncode == 0
    assert sorted(p.name for p in sock_dir.iterdir()) == []  # genie.sock, worker.sock, admin.sock, kv.sock gone
    saved = list((tmp_path / "kv").glob("c-porch.*.kv"))
    assert len(saved) == 1, list((tmp_path / "kv").iterdir())  # the cancelled turn's KV reached the disk
    r = ctl(sock_dir, "status")
    assert r.returncode == 2 and "no daemon socket" in r.stderr


def test_genie_ctl_knows_a_stale_socket_file_at_once(tmp_path):
    """A daemon killed with SIGKILL leaves its socket files: genie-ctl used to wait its 3 s timeout on one."""
    import socket

    sock_dir = tmp_path / "run"
    sock_dir.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_dir / "admin.sock"))
    stale.close()  # the file stays, nobody listens
    r = ctl(sock_dir, "status")
    assert r.returncode == 2 and "no daemon listens" in r.stderr, r.stderr
    assert isinstance(r, subprocess.CompletedProcess)


def test_genie_ctl_stop_is_sigterm_and_the_log_says_why_and_how_long(tmp_path):
    """Issue 34 item 6: `genie-ctl stop` instead of `pkill genie-daemon` (which matches other users' daemons):
    the running turn ends cancelled with its KV saved, the daemon exits 0, genie-ctl returns once it has."""
    proc, endpoint = start_daemon(tmp_path, model="gemma3-270m", ctx=2048, backend="numpy", ready_timeout_s=120)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    events: list = []
    stopped: list[subprocess.CompletedProcess] = []

    async def turn() -> None:
        params = {"temperature": 0.0, "max_tokens": 1500, "ignore_eos": True}
        async with GenieClient(endpoint, timeout_s=60) as client:
            async for ev in client.generate(prompt=PROMPT, params=params, conv_id="porch"):
                events.append(ev)
                if len(events) == 3:
                    stopped.append(await asyncio.to_thread(ctl, sock_dir, "stop"))

    try:
        asyncio.run(turn())
        _, log = proc.communicate(timeout=15)  # a hang guard
    except BaseException:
        proc.kill()
        raise
    assert stopped[0].returncode == 0 and f"pid {proc.pid}" in stopped[0].stdout, stopped[0]
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "cancelled", events[-1]
    assert proc.returncode == 0 and sorted(p.name for p in sock_dir.iterdir()) == []
    assert len(list((tmp_path / "kv").glob("c-porch.*.kv"))) == 1
    shutdown = [line for line in log.splitlines() if "event=shutdown" in line]
    assert len(shutdown) == 1 and "reason=genie-ctl stop took_s=" in shutdown[0], log[-2000:]


def test_sigterm_is_logged_with_its_reason(tmp_path):
    proc, _ = start_daemon(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, log = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "event=shutdown reason=SIGTERM took_s=" in log, log[-2000:]


def test_genie_ctl_stop_without_a_daemon_says_so(tmp_path):
    r = ctl(tmp_path / "run", "stop")
    assert r.returncode == 2 and "not running" in r.stderr


def test_every_command_prints_the_version():
    import sys

    from genie_common import __version__

    for module in ("genie_workers.cli", "genie_daemon", "genie_daemon.ctl"):
        r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == f"genie {__version__}", (module, r)
