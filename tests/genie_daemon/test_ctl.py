"""genie-ctl against a scripted admin socket: where its options may stand, what `metrics` prints, and
what `--wait` says while the daemon starts. tests/genie_daemon/test_daemon.py drives it against the
real daemon."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from genie_daemon import ctl
from genie_daemon.metrics import DaemonMetrics
from genie_protocol.messages import Message, Metrics, Reply, Status

READY = {"ready": True, "model": "tiny", "loaded_model": "tiny", "load_error": None}


class ScriptedAdmin:
    """Stands in for `_admin_call`: answers each call with the next scripted step (a dict is a REPLY's
    data, an exception is raised), repeating the last one; records where and what was asked."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self.calls: list[tuple[str, Message]] = []

    def __call__(self, endpoint: str, msg: Message) -> Message:
        self.calls.append((endpoint, msg))
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, Exception):
            raise step
        return Reply(request_id=msg.request_id, data=step)


@pytest.fixture
def admin(monkeypatch) -> Iterator[ScriptedAdmin]:
    scripted = ScriptedAdmin([READY])
    monkeypatch.setattr(ctl, "_admin_call", scripted)
    monkeypatch.setattr(ctl.time, "sleep", lambda s: None)  # --wait polls: no need to pause in a test
    yield scripted


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "--socket-dir", "/tmp/g", "status"],
        ["status", "--json", "--socket-dir", "/tmp/g"],
        ["--socket-dir", "/tmp/g", "status", "--json"],
        ["--json", "status", "--socket-dir", "/tmp/g", "--wait", "5"],
    ],
)
def test_global_options_before_or_after_the_command(admin, capsys, argv):
    """`genie-ctl status --json` was a usage error: only `genie-ctl --json status` worked (issue 16)."""
    assert ctl.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == READY
    assert {endpoint for endpoint, _ in admin.calls} == {"ipc:///tmp/g/admin.sock"}
    assert isinstance(admin.calls[-1][1], Status)


def test_metrics_prints_the_counters(admin, capsys):
    """`genie-ctl metrics` printed the same as `status`: it asks METRICS and prints the daemon's counters,
    the figures GET /metrics has."""
    metrics = DaemonMetrics()
    metrics.observe_done("stop", {"prompt_tokens": 12, "cached_tokens": 4, "completion_tokens": 7}, {"ttft_ms": 30})
    metrics.observe_error("overloaded")
    state = {"ready": True, "running": 3, "slots": {"in_use": 3, "total": 4}, "queue": 2, "kv": {"hits": 3}}
    counters = metrics.counters(state)
    assert counters['genie_requests_total{finish="stop"}'] == 1
    assert counters['genie_requests_total{finish="error:overloaded"}'] == 1
    assert counters["genie_generated_tokens_total"] == 7 and counters["genie_cached_tokens_total"] == 4
    assert counters["genie_time_to_first_token_seconds_count"] == 1 and counters["genie_requests_waiting"] == 2
    assert counters["genie_requests_running"] == 3 and counters["genie_slots_total"] == 4  # issue 17: N at once
    assert counters["genie_kv_store_hits"] == 3 and counters["genie_ready"] == 1
    assert not [k for k in counters if k.endswith(("_bucket", "_created"))]  # for Prometheus, not people
    admin.steps = [counters]
    assert ctl.main(["metrics"]) == 0
    out = capsys.readouterr().out
    assert isinstance(admin.calls[-1][1], Metrics)
    assert any(line.split() == ["genie_generated_tokens_total", "7"] for line in out.splitlines()), out
    assert ctl.main(["metrics", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == counters


def test_status_shows_the_slots_in_use_of_the_total(admin, capsys):
    """The worker runs several requests at once (issue 17): `genie-ctl status` says how many of its slots
    are taken, on one line; --json keeps STATUS's own shape."""
    admin.steps = [{**READY, "queue": 1, "running": 2, "slots": {"in_use": 2, "total": 4}}]
    assert ctl.main(["status"]) == 0
    rows = {line.split()[0]: line.split(None, 1)[1] for line in capsys.readouterr().out.splitlines()}
    assert rows["slots"] == "2 / 4 in use" and rows["running"] == "2" and rows["queue"] == "1"
    assert ctl.main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == {"in_use": 2, "total": 4}


def test_wait_says_what_it_waits_for_once_per_change(admin, capsys):
    """The first start took minutes in silence (issue 16): the daemon not up, then the worker loading."""
    loading = {"ready": False, "loaded_model": "gemma3-270m", "load_error": None}
    down = ctl.NotRunning("no daemon socket at /tmp/g/admin.sock")
    admin.steps = [down, down, down, loading, loading, loading, READY]
    assert ctl.main(["--socket-dir", "/tmp/g", "--wait", "60", "health"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 2, lines
    assert "waiting for the daemon" in lines[0] and "/tmp/g" in lines[0]
    assert "loading gemma3-270m" in lines[1]
    assert captured.out.strip() == "healthy"


def test_wait_stops_at_a_failed_load(admin, capsys):
    """A model the worker cannot load is not retried: waiting on would only end at the deadline."""
    admin.steps = [{"ready": False, "loaded_model": "x", "load_error": "the worker could not load 'x'"}]
    assert ctl.main(["--wait", "5", "status"]) == 1
    assert "could not load 'x'" in capsys.readouterr().err


def test_output_into_a_closed_pipe_is_no_traceback(tmp_path):
    """`genie-ctl metrics | head` printed a BrokenPipeError traceback once head had read enough."""
    import subprocess
    import sys

    from tests.child_env import child_env

    code = (
        "import sys, genie_daemon.ctl as c\n"
        "c._admin_call = lambda *a: c.Reply(request_id='ctl', data={f'k{i}': i for i in range(20000)})\n"
        "sys.exit(c.main(['--socket-dir', sys.argv[1], 'metrics']))\n"
    )
    ctl = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env()
    )
    assert ctl.stdout is not None and ctl.stdout.readline()
    ctl.stdout.close()  # what head does after its lines
    _, err = ctl.communicate(timeout=60)
    assert ctl.returncode == 0 and b"Traceback" not in err, err.decode()


def test_wait_says_when_the_daemon_pulls_its_model_first(admin, capsys):
    """auto_pull: a first start that downloads the model says so, not "loading", while it downloads."""
    pulling = {"ready": False, "loaded_model": "qwen3-0.6b", "load_error": None, "pulling": {"status": "downloading"}}
    loading = {**pulling, "pulling": None}
    admin.steps = [pulling, pulling, loading, READY]
    assert ctl.main(["--wait", "60", "health"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "pulling qwen3-0.6b: downloading" in lines[0] and "loading qwen3-0.6b" in lines[1]
