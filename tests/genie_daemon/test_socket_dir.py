"""The socket directory through real daemons (issue 34 items 1 and 4): a second daemon on it refuses to start
and leaves the first serving; a killed daemon's sockets are taken over; the directory and the sockets get
their modes whatever the umask and however the directory came to be."""

from __future__ import annotations

import grp
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.child_env import child_env
from tests.genie_daemon.test_daemon import ROOT, ctl, start_daemon

SOCKETS = ("genie.sock", "worker.sock", "admin.sock", "kv.sock")


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)[1]
    finally:
        proc.kill()


def second_daemon(tmp: Path, sock_dir: Path) -> subprocess.CompletedProcess:
    """Another daemon on `sock_dir`, with a KV directory and an HTTP port of its own (any free one: the case
    where it used to start and serve in the first one's place)."""
    cmd = [sys.executable, "-m", "genie_daemon", "-m", str(tmp / "tiny.gguf"), "--ctx", "512"]
    cmd += ["--socket-dir", str(sock_dir), "--kv-cache-dir", str(tmp / "kv2"), "--http-port", "0"]
    return subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)


def test_a_second_daemon_on_the_same_directory_refuses_and_the_first_serves_on(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        first = json.loads(ctl(sock_dir, "--json", "status").stdout)
        inodes = {name: (sock_dir / name).stat().st_ino for name in SOCKETS}
        t0 = time.monotonic()
        b = second_daemon(tmp_path, sock_dir)
        refused_s = time.monotonic() - t0
        assert b.returncode == 2, b.stderr
        lines = b.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first['daemon_pid']}" in lines[0], b.stderr
        assert refused_s < 10, refused_s  # at once: it loads no model, starts no worker (a hang guard)
        # the first daemon's sockets are the ones it bound, and it still answers on them
        assert {name: (sock_dir / name).stat().st_ino for name in SOCKETS} == inodes
        after = json.loads(ctl(sock_dir, "--json", "status").stdout)
        assert after["daemon_pid"] == first["daemon_pid"] and after["worker_pid"] == first["worker_pid"]
        assert after["ready"] and after["worker_restarts"] == 0
        gen = ctl(sock_dir, "generate", "-n", "3", "hi")
        assert gen.returncode == 0, gen.stderr
    finally:
        stop(proc)


def test_a_killed_daemons_sockets_are_taken_over(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    worker = json.loads(ctl(sock_dir, "--json", "status").stdout)["worker_pid"]
    proc.kill()  # SIGKILL: its socket files and its lock file stay
    proc.communicate(timeout=10)
    try:
        os.kill(worker, signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert (sock_dir / "genie.sock").exists() and (sock_dir / "genie.lock").exists()
    again, _ = start_daemon(tmp_path)
    try:
        gen = ctl(sock_dir, "generate", "-n", "3", "hi")
        assert gen.returncode == 0, gen.stderr
    finally:
        stop(again)
    assert sorted(p.name for p in sock_dir.iterdir()) == []  # sockets and lock removed at its stop


def modes(sock_dir: Path) -> dict[str, int]:
    found = {name: stat.S_IMODE((sock_dir / name).stat().st_mode) for name in SOCKETS}
    return {".": stat.S_IMODE(sock_dir.stat().st_mode), **found}


def test_a_directory_that_existed_0755_under_umask_002_is_made_private(tmp_path):
    sock_dir = tmp_path / "run"
    sock_dir.mkdir()
    os.chmod(sock_dir, 0o755)  # a user's mkdir, or systemd's RuntimeDirectory= at its default
    proc, _ = start_daemon(tmp_path, umask=0o002)
    try:
        assert modes(sock_dir) == {".": 0o700, **dict.fromkeys(SOCKETS, 0o600)}
    finally:
        stop(proc)


def test_socket_group_lets_its_members_use_the_client_socket_only(tmp_path):
    group = grp.getgrgid(os.getegid()).gr_name  # a group this user may give files to
    sock_dir = tmp_path / "run"
    sock_dir.mkdir(mode=0o777)
    os.chmod(sock_dir, 0o777)
    config = tmp_path / "genie.toml"
    config.write_text(f'socket_group = "{group}"\n')
    proc, _ = start_daemon(tmp_path, "--config", str(config), umask=0o000)
    try:
        want = {".": 0o750, "genie.sock": 0o660, "worker.sock": 0o600, "admin.sock": 0o600, "kv.sock": 0o600}
        assert modes(sock_dir) == want
        assert (sock_dir / "genie.sock").stat().st_gid == os.getegid()
    finally:
        stop(proc)


def test_a_socket_group_that_does_not_exist_stops_the_daemon_with_one_line(tmp_path):
    config = tmp_path / "genie.toml"
    config.write_text('socket_group = "no-such-group-genie"\n')
    cmd = [sys.executable, "-m", "genie_daemon", "--config", str(config), "--socket-dir", str(tmp_path / "run")]
    r = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "no-such-group-genie" in r.stderr and "no such group" in r.stderr
