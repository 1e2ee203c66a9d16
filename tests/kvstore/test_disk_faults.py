"""What the disk does to the store (issue 34): a disk that fills up below the size cap, a cache directory
deleted while the store runs, and a crashed writer's temp files. None of them may stop saves for good."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from genie_kvstore.format import entry_bytes
from genie_kvstore.server import KVStoreServer, ServerConfig
from genie_kvstore.store import KVStore, Saved, StoreConfig
from genie_kvstore.wire import layout_body, snapshot_frames
from genie_protocol.codec import encode
from genie_protocol.kv_messages import KvData, KvLookup, KvSave, KvSaved
from genie_protocol.messages import Error, KvList, Metrics, Reply
from tests.kvstore.kv_data import FINGERPRINT, layout, snapshot
from tests.kvstore.small_disk import SmallDisk

if TYPE_CHECKING:
    from genie_kvstore.store import NotSaved

N_TOKENS = 100
ROOT = Path(__file__).parents[2]
# a save of the store's own code, killed (SIGKILL) with its whole entry written to the temp file, before the rename
CRASHING_WRITER = """
import os, signal, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, {root!r})
from genie_kvstore.store import KVStore, StoreConfig
from tests.kvstore.kv_data import FINGERPRINT, layout, snapshot
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
rng = np.random.default_rng(int(sys.argv[2]))
store = KVStore(StoreConfig(Path(sys.argv[1])), FINGERPRINT, layout())
store.save(snapshot(store.layout, rng.integers(0, 30_000, {n}), rng), conv_id=sys.argv[3])
"""


def tokens(seed: int, n: int = N_TOKENS) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 30_000, n).astype(np.int32)


def save(store: KVStore, conv: str, seed: int, n: int = N_TOKENS) -> Saved | NotSaved:
    return store.save(snapshot(store.layout, tokens(seed, n), np.random.default_rng(seed)), conv_id=conv)


def used_at(path: Path, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(path, (t, t))


def test_a_full_disk_below_the_cap_evicts_least_recently_used_until_the_save_fits(tmp_path, monkeypatch):
    """Item 7: the disk fills up long before the 1 GiB cap. A save that meets ENOSPC evicts entries, least
    recently used first, until it fits, and is written on its one retry; one that cannot fit even on an empty
    disk fails as a value, counted, and the next save is written."""
    store = KVStore(StoreConfig(tmp_path / "kv"), FINGERPRINT, layout())  # the default cap: far above the disk
    one = entry_bytes(store.layout, "a", N_TOKENS)
    disk = SmallDisk(monkeypatch, store.dir, capacity=3 * one + one // 2)  # three entries fit, not four
    for age, conv in zip((30, 20, 10), "abc", strict=True):
        assert isinstance(save(store, conv, ord(conv)), Saved)
        used_at(store.dir / store._name("c", conv), age)
    assert store.hydrate(tokens(ord("a")), conv_id="a") is not None  # a is now the most recently used
    got = save(store, "d", ord("d"))
    assert isinstance(got, Saved), got
    assert disk.refused == 1 and store.metrics.evictions == 1 and store.metrics.save_failures == 0
    assert sorted(e["conv_id"] for e in store.entries()) == ["a", "c", "d"]  # b was least recently used
    assert store.hydrate(tokens(ord("d")), conv_id="d") is not None

    too_big = save(store, "huge", 1, n=5 * N_TOKENS)  # more than the whole disk: everything goes, still no room
    assert not isinstance(too_big, Saved) and too_big.code == "kv_io" and "No space left" in too_big.message
    assert store.metrics.save_failures == 1 and store.entries() == []
    assert isinstance(save(store, "e", ord("e")), Saved)  # the store goes on
    assert store.metrics.saves == 5


def test_status_counts_failed_saves_and_shows_the_last_error(tmp_path, monkeypatch):
    """Item 7: `genie-ctl status` showed no error while every save failed. The store's METRICS (STATUS's `kv`)
    counts the failed saves and says what the last error was."""
    directory = tmp_path / "kv"
    server = KVStoreServer(ServerConfig(f"ipc://{tmp_path}/kv.sock", StoreConfig(directory)))
    try:
        SmallDisk(monkeypatch, directory, capacity=entry_bytes(layout(), "x", N_TOKENS) // 2)  # nothing fits
        rng = np.random.default_rng(0)
        snap = snapshot(layout(), tokens(0), rng)
        msg = KvSave(
            request_id="s1",
            fingerprint=FINGERPRINT.hex(),
            layout=layout_body(layout()),
            token_ids=[int(t) for t in snap.token_ids],
            conv_id="x",
        )
        for _ in range(2):
            reply, _ = server.handle([memoryview(f) for f in encode(msg, snapshot_frames(snap))])
            assert isinstance(reply, Error) and reply.code == "kv_io" and reply.request_id == "s1", reply
        metrics, _ = server.handle([memoryview(f) for f in encode(Metrics(request_id="m"))])
        assert isinstance(metrics, Reply)
        assert metrics.data["save_failures"] == 2 and metrics.data["saves"] == 0
        assert "No space left on device" in metrics.data["last_error"], metrics.data
        monkeypatch.undo()  # space again
        reply, _ = server.handle([memoryview(f) for f in encode(msg, snapshot_frames(snap))])
        assert isinstance(reply, KvSaved)
    finally:
        server.sock.close()
        server.ctx.term()


def crash_a_writer(tmp_path: Path, directory: Path, conv: str, seed: int) -> Path:
    """The temp file a save killed mid-write leaves behind, made by the store's own write."""
    script = tmp_path / "crashing_writer.py"
    script.write_text(CRASHING_WRITER.format(root=str(ROOT), n=N_TOKENS))
    before = set(directory.glob(".*"))
    run = subprocess.run([sys.executable, str(script), str(directory), str(seed), conv], capture_output=True)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    (orphan,) = set(directory.glob(".*")) - before
    return orphan


def test_a_crashed_writers_temp_files_go_at_the_next_save_after_their_age(tmp_path, monkeypatch):
    """Item 11: three temp files of saves killed mid-write stayed beyond kv_cache_stale_tmp_s. They are named
    as the sweep looks for them and their age is read right; they stayed because the sweep ran only after a
    save had been written, and on a full disk (item 7) none was: the orphans, which hold part of that disk,
    were never removed. The sweep runs first in every save now, so the space they held is the new entry's,
    and no entry is evicted for it."""
    directory = tmp_path / "kv"
    store = KVStore(StoreConfig(directory, stale_tmp_s=60), FINGERPRINT, layout())
    for conv in "ab":
        assert isinstance(save(store, conv, ord(conv)), Saved)
    orphans = [crash_a_writer(tmp_path, directory, f"killed{i}", i) for i in range(3)]
    one = entry_bytes(store.layout, "a", N_TOKENS)
    for orphan in orphans:
        assert re.fullmatch(r"\.c-killed\d\.[0-9a-f]{8}\.kv\.\d+\.[0-9a-f]{8}\.tmp", orphan.name), orphan.name
        assert orphan.stat().st_size == one  # the whole entry: the writer died at its fsync, before the rename
        used_at(orphan, 61)  # older than stale_tmp_s
    disk = SmallDisk(monkeypatch, directory, capacity=disk_used(directory) + one // 2)  # full with the orphans
    got = save(store, "c", ord("c"))
    assert isinstance(got, Saved), got
    assert [p for p in orphans if p.exists()] == []
    assert disk.refused == 0 and store.metrics.evictions == 0  # the orphans' space sufficed
    assert sorted(e["conv_id"] for e in store.entries()) == ["a", "b", "c"]

    late = crash_a_writer(tmp_path, directory, "killed3", 3)
    used_at(late, 61)
    store.config = StoreConfig(directory, max_bytes=one // 2, stale_tmp_s=60)
    refused = save(store, "d", ord("d"))  # a save that is not written sweeps all the same
    assert not isinstance(refused, Saved) and refused.code == "kv_too_large"
    assert not late.exists()


def disk_used(directory: Path) -> int:
    return sum(p.lstat().st_size for p in directory.iterdir() if p.is_file())


def test_a_cache_directory_deleted_while_the_store_runs_is_made_again_private_at_the_next_save(tmp_path):
    """Item 8: the directory removed at run time (rm -rf, a cleaner) made every lookup an I/O error, and
    `kv ls` and METRICS too, until a restart. Now a lookup is a miss, the admin calls answer, and the next save
    makes the directory again, 0700, where later lookups find what it saved."""
    directory = tmp_path / "kv"
    server = KVStoreServer(ServerConfig(f"ipc://{tmp_path}/kv.sock", StoreConfig(directory)))

    def ask(msg, side=()):
        reply, frames = server.handle([memoryview(f) for f in encode(msg, list(side))])
        return reply, frames

    def request(kind, conv: str | None, seed: int):
        rng = np.random.default_rng(seed)
        snap = snapshot(layout(), tokens(seed, 2 * 64), rng)
        ids = [int(t) for t in snap.token_ids]
        body = dict(fingerprint=FINGERPRINT.hex(), layout=layout_body(layout()), conv_id=conv)
        if kind is KvSave:
            return ask(KvSave(request_id="s", token_ids=ids, **body), snapshot_frames(snap))
        return ask(KvLookup(request_id="l", token_ids=ids + [7], **body))

    try:
        assert isinstance(request(KvSave, "den", 1)[0], KvSaved)
        shutil.rmtree(directory)
        for conv in ("den", None):  # by its id, and from the tokens alone
            reply, _ = request(KvLookup, conv, 1)
            assert isinstance(reply, KvData) and reply.n_tokens == 0, reply  # a miss, not an I/O error
        listed, _ = ask(KvList(request_id="ls"))
        assert isinstance(listed, Reply) and listed.data["entries"] == [], listed
        metrics, _ = ask(Metrics(request_id="m"))
        assert isinstance(metrics, Reply) and metrics.data["entries"] == 0, metrics
        reply, _ = request(KvSave, None, 2)  # an anonymous save first: it scans the directory for what it supersedes
        assert isinstance(reply, KvSaved), reply
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert isinstance(request(KvSave, "den", 1)[0], KvSaved)
        for conv, seed in (("den", 1), (None, 2)):
            reply, frames = request(KvLookup, conv, seed)
            assert isinstance(reply, KvData) and reply.n_tokens == 2 * 64 and frames, reply
    finally:
        server.sock.close()
        server.ctx.term()
