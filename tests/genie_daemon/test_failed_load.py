"""After a model fails to load, every request is answered at once on every front (issue 34 item 2): a
ZeroMQ GENERATE queued before the failure, and every one after it, gets ERROR(model_unavailable) with the
worker's reason; HTTP answers 503 with it; STATUS and /health say why."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from genie_protocol.client import GenieClient
from genie_protocol.messages import Error
from tests.genie_daemon.test_daemon import collect, ctl, start_daemon
from tests.genie_daemon.test_http_live import free_port, get_json

SHORT = {"token_ids": [1, 5, 6, 7], "params": {"max_tokens": 3, "ignore_eos": True}}


def test_a_truncated_model_and_a_worker_restart_answer_every_request_at_once(tmp_path):
    port = free_port()
    proc, endpoint = start_daemon(tmp_path, "--http-port", str(port))
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    model = tmp_path / "tiny.gguf"
    try:
        worker = json.loads(ctl(sock_dir, "--json", "status").stdout)["worker_pid"]
        os.truncate(model, model.stat().st_size // 2)
        os.kill(worker, signal.SIGKILL)  # the daemon restarts it, and the new one cannot load the file
        deadline = time.monotonic() + 10
        while json.loads(ctl(sock_dir, "--json", "status").stdout)["ready"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the daemon has seen the old one go: the next request waits for the new one

        async def queued_then_new() -> tuple[Error, Error, float]:
            async with GenieClient(endpoint, timeout_s=30) as client:  # the timeout: a hang guard only
                _, first = await collect(client, **SHORT)  # sent while the worker restarts: it waits
                t0 = time.monotonic()
                _, second = await collect(client, **SHORT)
                return first, second, time.monotonic() - t0

        first, second, second_s = asyncio.run(queued_then_new())
        for end in (first, second):
            assert isinstance(end, Error) and end.code == "model_unavailable", end
            assert "truncated file" in end.message, end.message  # the worker's own reason
        assert second_s < 1.0, second_s  # at once, not after a timeout
        status = json.loads(ctl(sock_dir, "--json", "status").stdout)
        assert not status["ready"] and status["queue"] == 0 and "truncated file" in status["load_error"], status
        code, health = get_json(f"http://127.0.0.1:{port}/health")
        assert code == 503 and health["status"] == "load_failed" and "truncated file" in health["error"], health
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/generate",
            data=json.dumps({"model": str(model), "prompt": "hi", "stream": False}).encode(),
        )
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("the HTTP request was answered 200")
        except urllib.error.HTTPError as e:
            assert e.code == 503 and "truncated file" in json.loads(e.read())["error"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        finally:
            proc.kill()


def test_workers_that_keep_dying_while_they_load_make_a_load_error(tmp_path):
    """Not only exit code 2: a worker killed while loading (the kernel's OOM killer, a crash) is retried, but
    after MAX_EARLY_EXITS in a row the load counts as failed, and requests are answered instead of waiting."""
    from genie_daemon.server import MAX_EARLY_EXITS

    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    killed: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = json.loads(ctl(sock_dir, "--json", "status").stdout)
            if status["load_error"]:
                break
            pid = status["worker_pid"]
            if pid not in killed:  # each new worker, as soon as it is seen (ready or still loading)
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.02)
        assert "exited with code -9" in status["load_error"], status
        assert MAX_EARLY_EXITS <= len(killed) and not status["ready"], status
        _, end = asyncio.run(one_request(endpoint))
        assert isinstance(end, Error) and end.code == "model_unavailable", end
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        finally:
            proc.kill()


async def one_request(endpoint: str) -> tuple[list, object]:
    async with GenieClient(endpoint, timeout_s=10) as client:
        return await collect(client, **SHORT)
