"""kill -9 of the KV-store process at random moments while it takes saves: no corrupt entry is ever
served, and every save it acknowledged (KV_SAVED) before the kill is readable after a restart.
CI: 50 acknowledged saves; `-m soak`: 1 000."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from genie_common.child_config import StorePart, to_arg
from genie_kvstore.format import read_entry, read_header
from genie_kvstore.store import KVStore, StoreConfig
from genie_kvstore.wire import layout_body, snapshot_frames
from genie_protocol.codec import decode, encode
from genie_protocol.kv_messages import KvSave, KvSaved
from tests.kvstore.kv_data import FINGERPRINT, layout, snapshot

ROOT = Path(__file__).parents[2]


def save_message(i: int) -> list:
    rng = np.random.default_rng(i)
    snap = snapshot(layout(), rng.integers(0, 1000, 64 + i % 300), rng)
    msg = KvSave(
        request_id=f"s{i}",
        fingerprint=FINGERPRINT.hex(),
        layout=layout_body(layout()),
        token_ids=[int(t) for t in snap.token_ids],
        conv_id=f"s{i}",
    )
    return encode(msg, snapshot_frames(snap))


def start_store(directory: Path, endpoint: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "genie_kvstore", "--part", to_arg(StorePart(endpoint, str(directory), 0, 60.0))],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )


def crash_saves(tmp_path: Path, n_saves: int) -> int:
    directory = tmp_path / "kv"
    endpoint = f"ipc://{tmp_path}/kv.sock"
    r = random.Random(3)
    acked: list[int] = []
    kills = 0
    ctx = zmq.Context()
    try:
        while len(acked) < n_saves:
            proc = start_store(directory, endpoint)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            killer = threading.Timer(r.uniform(0.0, 0.25), proc.kill)  # armed at the first answer: mid-save
            i = acked[-1] + 1 if acked else 0
            while proc.poll() is None and len(acked) < n_saves:
                sock.send_multipart(save_message(i))
                while not sock.poll(50) and proc.poll() is None:
                    pass
                if not sock.poll(0):
                    break  # killed before it answered: this save was never acknowledged
                reply, _ = decode(sock.recv_multipart())
                assert isinstance(reply, KvSaved) and reply.request_id == f"s{i}", reply
                acked.append(i)
                i += 1
                if not killer.is_alive() and not killer.finished.is_set():
                    killer.start()
            killer.cancel()
            proc.kill()
            proc.wait()
            kills += 1
            sock.close()
            check_after_crash(directory, acked)
    finally:
        ctx.term()
    return kills


def check_after_crash(directory: Path, acked: list[int]) -> None:
    from tests.kvstore.kv_data import snapshot as make

    store = KVStore(StoreConfig(directory, max_bytes=0), FINGERPRINT, layout())
    for i in acked:  # every acknowledged save is there and whole
        rng = np.random.default_rng(i)
        want = make(store.layout, rng.integers(0, 1000, 64 + i % 300), rng)
        got = store.hydrate(want.token_ids, conv_id=f"s{i}")
        assert got is not None and got.n_tokens == want.n_tokens, f"acknowledged save s{i} lost"
        np.testing.assert_array_equal(got.k[-1], want.k[-1])
    for p in directory.glob("*.kv"):  # every entry on disk is whole: a save becomes visible only complete
        h = read_header(p)
        read_entry(h, h.n_tokens)
    assert store.metrics.rejected == 0


def test_kill_9_of_the_store_during_saves(tmp_path):
    assert crash_saves(tmp_path, 50) >= 1


@pytest.mark.soak
def test_kill_9_of_the_store_during_saves_long(tmp_path):
    start = time.monotonic()
    kills = crash_saves(tmp_path, 1000)
    print(f"1000 acknowledged saves, {kills} kills, {time.monotonic() - start:.0f} s")
