"""The daemon's log under a flood (issue 34 item 18): at most one line a second of each kind, then a line
counting what was left out; driven through the filter with a scripted clock, and through a real daemon
sent hundreds of malformed HTTP requests."""

from __future__ import annotations

import logging
import re
import signal
import socket
import sys
import time

from genie_daemon.log_limit import RepeatLimit
from tests.genie_daemon.test_daemon import start_daemon
from tests.genie_daemon.test_http_hardening import MALFORMED
from tests.genie_daemon.test_http_live import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def limited() -> tuple[logging.Logger, Lines, RepeatLimit, Clock]:
    clock = Clock()
    handler = Lines()
    limit = RepeatLimit(handler, interval_s=1.0, clock=clock)
    handler.addFilter(limit)
    log = logging.getLogger("genie.test_log_limit")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG)
    return log, handler, limit, clock


def test_one_line_a_second_of_each_kind_then_a_count():
    log, out, limit, clock = limited()
    for i in range(50):  # one kind: the same format, whatever its arguments
        log.info("event=http_bad_request remote=%r", f"10.0.0.{i}")
        clock.now += 0.01
    log.warning("event=worker_dead reason=%r", "x")  # another kind passes at once
    assert out.lines == ["INFO event=http_bad_request remote='10.0.0.0'", "WARNING event=worker_dead reason='x'"]
    clock.now += 1.0
    log.info("event=http_bad_request remote=%r", "10.0.0.99")  # a new second: the count, then the line
    assert out.lines[2:] == [
        "INFO event=log_suppressed kind='event=http_bad_request' count=49 logger=genie.test_log_limit",
        "INFO event=http_bad_request remote='10.0.0.99'",
    ]


def test_a_count_comes_with_any_later_line_or_at_the_end():
    log, out, limit, clock = limited()
    for _ in range(3):
        log.info("event=a n=%d", 1)
    log.info("event=b")
    clock.now += 1.5
    log.info("event=c")  # the flood of `a` ended: its count comes with the next line of any kind
    assert out.lines == [
        "INFO event=a n=1",
        "INFO event=b",
        "INFO event=log_suppressed kind='event=a' count=2 logger=genie.test_log_limit",
        "INFO event=c",
    ]
    for _ in range(4):
        log.error("event=d")
    limit.flush()  # the daemon's exit
    assert out.lines[-2:] == [
        "ERROR event=d",
        "ERROR event=log_suppressed kind='event=d' count=3 logger=genie.test_log_limit",
    ]
    limit.flush()
    assert len(out.lines) == 6  # nothing twice


def test_a_flood_of_malformed_requests_logs_a_line_a_second_through_the_daemon(tmp_path):
    """300 malformed requests (the raw ones of test_http_hardening.py) to a real daemon: before, 300
    `event=http_bad_request` lines (1 535 for 5 000 in issue 34's run); now one a second, and the counts
    of the rest add up to 300."""
    port = free_port()
    proc, _ = start_daemon(tmp_path, "--http-port", str(port))
    n = 300
    t0 = time.monotonic()
    for i in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(MALFORMED[i % len(MALFORMED)])
            while c.recv(4096):  # the daemon answers 400 and closes
                pass
    elapsed = time.monotonic() - t0
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    shown = [line for line in err.splitlines() if line.startswith("INFO event=http_bad_request ")]
    counts = [int(m) for m in re.findall(r"event=log_suppressed kind='event=http_bad_request' count=(\d+)", err)]
    assert len(shown) <= elapsed + 2, f"{len(shown)} lines in {elapsed:.1f} s"
    assert len(shown) + sum(counts) == n, (len(shown), counts)
    assert proc.returncode == 0


def test_main_in_process_leaves_the_root_handlers_as_they_were(tmp_path, monkeypatch):
    """genie-daemon's main() run in process (tests do) put its filters on the root logger's handlers and left
    them there: pytest's own handlers then dropped every later test's repeated log lines, and five KV-store and
    HTTP tests that count lines failed after test_config's. Its filters go when it returns, however it returns."""
    from genie_daemon import __main__ as cli

    async def serve(config) -> int:
        return 0

    monkeypatch.setattr(cli, "_serve", serve)
    monkeypatch.setitem(sys.modules, "uvloop", None)
    root = logging.getLogger()
    before = {h: list(h.filters) for h in root.handlers}
    none = str(tmp_path / "none.toml")
    assert cli.main(["--config", none]) == 0
    assert cli.main(["--config", none, "--parallel", "-1"]) == 2
    assert {h: list(h.filters) for h in root.handlers} == before
