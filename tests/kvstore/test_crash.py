"""kill -9 of a saving process at random moments: no corrupt entry is ever served, and every save
acknowledged before the kill is readable. CI: 50 saves; `-m soak`: 1 000."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvstore.format import read_entry, read_header
from kvstore.store import KVStore, StoreConfig
from tests.kvstore.kv_data import FINGERPRINT, layout

ROOT = Path(__file__).parents[2]

SAVER = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from pathlib import Path
from kvstore.format import read_entry, read_header
from kvstore.store import KVStore, StoreConfig
from tests.kvstore.kv_data import FINGERPRINT, layout, snapshot
directory, first = Path(sys.argv[1]), int(sys.argv[2])
store = KVStore(StoreConfig(directory, max_bytes=0, stale_tmp_s=3600), FINGERPRINT, layout())
for i in range(first, first + 100000):
    rng = np.random.default_rng(i)
    store.save(snapshot(store.layout, rng.integers(0, 1000, 64 + i % 300), rng), conv_id=f"s{{i}}")
    print(i, flush=True)  # acknowledged: save() returned, the entry is durable
"""


def crash_saves(tmp_path: Path, n_saves: int) -> None:
    from tests.kvstore.kv_data import snapshot

    script = tmp_path / "saver.py"
    script.write_text(SAVER.format(root=str(ROOT)))
    directory = tmp_path / "kv"
    r = random.Random(3)
    acked: list[int] = []
    while len(acked) < n_saves:
        first = acked[-1] + 1 if acked else 0
        proc = subprocess.Popen(
            [sys.executable, str(script), str(directory), str(first)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(r.uniform(0.3, 1.2))  # start-up (~0.3 s) and then some saves, killed wherever it is
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        acked += [int(line) for line in out.split()]
        store = KVStore(StoreConfig(directory, max_bytes=0), FINGERPRINT, layout())
        for i in acked:  # every acknowledged save is there and whole
            rng = np.random.default_rng(i)
            want = snapshot(store.layout, rng.integers(0, 1000, 64 + i % 300), rng)
            got = store.hydrate(want.token_ids, conv_id=f"s{i}")
            assert got is not None and got.n_tokens == want.n_tokens, f"acknowledged save s{i} lost"
            np.testing.assert_array_equal(got.k[0], want.k[0])
        for p in directory.glob("*.kv"):  # every entry on disk is whole: a save shows only once complete
            h = read_header(p)
            read_entry(h, h.n_tokens)
        assert store.metrics.rejected == 0
        assert not (set(directory.glob("*.kv")) - {directory / f"c-s{i}.kv" for i in range(acked[-1] + 2)})


def test_kill_9_during_saves(tmp_path):
    crash_saves(tmp_path, 50)


@pytest.mark.soak
def test_kill_9_during_saves_long(tmp_path):
    crash_saves(tmp_path, 1000)
