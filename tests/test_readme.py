"""The README's first HTTP example, run as a new user runs it: on the default model it answers sensibly,
and soon (issue 34 item 15: it was `/api/chat` on the default base model, which has no chat template, and
streamed 1 024 tokens of " мне" / "Hey" for 30 s)."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from genie_common.config import DaemonConfig
from tests.genie_daemon.test_daemon import start_daemon
from tests.genie_daemon.test_http_live import free_port

README = Path(__file__).resolve().parents[1] / "README.md"


def first_http_example() -> tuple[str, dict[str, Any]]:
    """The path and JSON body of the README's first `curl localhost:11434…` command."""
    m = re.search(r"`curl localhost:11434(/\S+) -d '([^']+)'`", README.read_text())
    assert m, "the README has no `curl localhost:11434/... -d '{...}'` example"
    return m.group(1), json.loads(m.group(2))


def test_the_first_http_example_answers_sensibly_on_the_default_model(tmp_path):
    path, body = first_http_example()
    assert body["model"] == DaemonConfig().model  # what the Quickstart's daemon serves
    port = free_port()
    proc, _ = start_daemon(tmp_path, "--http-port", str(port), model=body["model"], ctx=1024, ready_timeout_s=180)
    try:
        t0 = time.monotonic()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=180) as r:
            lines = [json.loads(line) for line in r.read().splitlines() if line.strip()]
        elapsed = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    text = "".join(line.get("response") or line.get("message", {}).get("content", "") for line in lines)
    last = lines[-1]
    assert last["done"] and last["eval_count"] <= 32, (last["eval_count"], round(elapsed, 1), text[:300])
    assert "Paris" in text, text
