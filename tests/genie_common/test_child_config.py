"""The daemon's configuration reaches its children as one serialized record each (child_config.py): what a
child parses is what the daemon built, and a malformed part is refused with a reason, by the child too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from genie_common.child_config import StorePart, WorkerPart, from_arg, to_arg
from genie_common.config import DaemonConfig
from tests.child_env import child_env


def test_each_part_round_trips():
    c = DaemonConfig(model="m.gguf", ctx=4096, parallel=3, fp16_kv=True, kv_store=False, stream_interval_ms=2)
    part = c.worker_part()
    assert from_arg(WorkerPart, to_arg(part)) == part
    assert part.kv_endpoint == "" and part.stream_interval_ms == 2.0  # no KV store: no endpoint
    store = DaemonConfig(kv_cache_max_mb=7).store_part()
    assert from_arg(StorePart, to_arg(store)) == store and store.max_mb == 7


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ('{"endpoint": "x"}', "missing"),
        (to_arg(StorePart("e", "d", 1, 1.0))[:-1] + ',"extra":1}', "unknown"),
        (to_arg(StorePart("e", "d", 1, 1.0)).replace('"max_mb":1', '"max_mb":true'), "max_mb"),
        (to_arg(StorePart("e", "d", 1, 1.0)).replace('"directory":"d"', '"directory":3'), "directory"),
    ],
)
def test_a_malformed_part_is_refused_with_its_reason(text, reason):
    with pytest.raises(ValueError, match=reason):
        from_arg(StorePart, text)


@pytest.mark.parametrize("module", ["genie_workers.worker", "genie_kvstore"])
def test_a_child_given_a_bad_part_exits_2_with_one_line(module):
    r = subprocess.run(
        [sys.executable, "-m", module, "--part", '{"endpoint": 1}'], capture_output=True, text=True, env=child_env()
    )
    assert r.returncode == 2 and "error: --part" in r.stderr, r.stderr
