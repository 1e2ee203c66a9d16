"""Files under an entry's name that genie did not write (issue 21 item 4): a self-symlink, a directory, a
FIFO and a stranger's regular file named `*.kv`. The store process goes on serving lookups, saves, the
size cap, `kv ls|evict|clear` and its metrics; every planted file is left as it was and logged once."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from genie_kvstore.server import KVStoreServer, ServerConfig
from genie_kvstore.store import KVStore, NotSaved, StoreConfig
from genie_kvstore.wire import layout_body, snapshot_frames
from genie_protocol.codec import encode
from genie_protocol.kv_messages import KvData, KvLookup, KvSave, KvSaved
from genie_protocol.messages import KvClear, KvEvict, KvList, Message, Metrics, Reply
from tests.kvstore.kv_data import FINGERPRINT, layout, snapshot

N_TOKENS = 100
PAST = 1_000_000_000  # 2001: older than anything genie saves, so LRU eviction reaches the planted files first


def plant(directory: Path) -> dict[str, object]:
    """The planted files, each with what must still be true of it afterwards."""
    directory.mkdir(parents=True)
    os.symlink("loop.kv", directory / "loop.kv")
    (directory / "aaa.kv").mkdir()
    (directory / "aaa.kv" / "inside").write_bytes(b"kept")
    os.mkfifo(directory / "zzz.kv")
    foreign = os.urandom(4096)
    (directory / "foreign.kv").write_bytes(foreign)
    for name in ("aaa.kv", "zzz.kv", "foreign.kv"):
        os.utime(directory / name, (PAST, PAST))
    return {"loop.kv": "loop.kv", "aaa.kv": b"kept", "zzz.kv": stat.S_IFIFO, "foreign.kv": foreign}


def untouched(directory: Path, planted: dict[str, object]) -> None:
    assert os.readlink(directory / "loop.kv") == planted["loop.kv"]
    assert (directory / "aaa.kv" / "inside").read_bytes() == planted["aaa.kv"]
    assert stat.S_ISFIFO(os.lstat(directory / "zzz.kv").st_mode)
    assert (directory / "foreign.kv").read_bytes() == planted["foreign.kv"]


def ask(server: KVStoreServer, msg: Message, side: list | None = None) -> tuple[Message, list]:
    reply, frames = server.handle([memoryview(f) for f in encode(msg, side or [])])
    return reply, frames


def save(server: KVStoreServer, conv: str, seed: int) -> Message:
    rng = np.random.default_rng(seed)
    snap = snapshot(layout(), rng.integers(0, 1000, N_TOKENS), rng)
    msg = KvSave(
        request_id=f"s-{conv}",
        fingerprint=FINGERPRINT.hex(),
        layout=layout_body(layout()),
        token_ids=[int(t) for t in snap.token_ids],
        conv_id=conv,
    )
    reply, _ = ask(server, msg, snapshot_frames(snap))
    return reply


@pytest.mark.timeout(120)  # hang guard: before the fix the FIFO blocked the store in open() for ever
def test_planted_files_neither_stop_the_store_nor_are_touched(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="genie.kvstore")
    directory = tmp_path / "kv"
    planted = plant(directory)
    entry = KVStore(StoreConfig(tmp_path / "probe"), FINGERPRINT, layout())  # only to learn one entry's size
    rng = np.random.default_rng(0)
    entry_bytes = entry.save(snapshot(layout(), rng.integers(0, 1000, N_TOKENS), rng), conv_id="probe").bytes
    cap = 3 * entry_bytes
    server = KVStoreServer(ServerConfig(f"ipc://{tmp_path}/kv.sock", StoreConfig(directory, max_bytes=cap)))
    try:
        for i in range(6):  # twice the cap: three evictions, all of genie's own entries
            reply = save(server, f"conv{i}", i)
            assert isinstance(reply, KvSaved), reply
            for _ in range(2):  # lookups see every planted file at each rescan: still one log line each
                rng = np.random.default_rng(i)
                ids = [int(t) for t in rng.integers(0, 1000, N_TOKENS)]
                lookup = KvLookup(
                    request_id="l",
                    fingerprint=FINGERPRINT.hex(),
                    layout=layout_body(layout()),
                    token_ids=ids,
                    conv_id=f"conv{i}",
                )
                data, frames = ask(server, lookup)
                assert isinstance(data, KvData) and data.n_tokens == N_TOKENS and frames, data
        genie_bytes = sum(p.stat().st_size for p in directory.glob("c-*.kv"))
        assert genie_bytes <= cap
        listed, _ = ask(server, KvList(request_id="ls"))
        assert isinstance(listed, Reply)
        ids = [e["id"] for e in listed.data["entries"]]
        assert sorted(ids) == sorted(p.name[:-3] for p in directory.glob("c-*.kv")) and len(ids) == 3
        metrics, _ = ask(server, Metrics(request_id="m"))
        assert isinstance(metrics, Reply)
        assert metrics.data["entries"] == 3 and metrics.data["bytes"] == genie_bytes
        assert metrics.data["evictions"] == 3
        evicted, _ = ask(server, KvEvict(request_id="ev", entry_id=ids[0]))
        assert isinstance(evicted, Reply) and evicted.data["evicted"] is True
        cleared, _ = ask(server, KvClear(request_id="cl"))
        assert isinstance(cleared, Reply) and cleared.data["cleared"] == 2, cleared
        assert list(directory.glob("c-*.kv")) == []
        listed, _ = ask(server, KvList(request_id="ls"))
        assert isinstance(listed, Reply) and listed.data["entries"] == []
    finally:
        server.sock.close()
        server.ctx.term()
    untouched(directory, planted)
    for name in planted:
        lines = [r.getMessage() for r in caplog.records if repr(name) in r.getMessage()]
        assert len(lines) == 1, (name, lines)


def test_a_genie_entry_that_fails_its_checksum_is_still_removed_but_a_foreign_file_is_not(tmp_path):
    rng = np.random.default_rng(1)
    store = KVStore(StoreConfig(tmp_path / "kv"), FINGERPRINT, layout())
    history = rng.integers(0, 1000, N_TOKENS)
    good = store.save(snapshot(layout(), history, rng), conv_id="good").path
    blob = bytearray(good.read_bytes())
    blob[-100] ^= 1
    good.write_bytes(bytes(blob))
    stranger = store.dir / store._name("c", "stranger")  # a genie name, but not genie's bytes
    stranger.write_bytes(b"PK\x03\x04" + bytes(4000))
    assert store.hydrate(history, conv_id="good") is None
    assert store.hydrate(history, conv_id="stranger") is None
    assert not good.exists() and stranger.read_bytes()[:4] == b"PK\x03\x04"
    assert store.clear() == 0 and stranger.exists()


def test_an_existing_cache_directory_is_made_private(tmp_path):
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)  # whatever the umask
    server = KVStoreServer(ServerConfig(f"ipc://{tmp_path}/kv.sock", StoreConfig(directory)))
    server.sock.close()
    server.ctx.term()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    os.chmod(directory, 0o751)
    KVStore(StoreConfig(directory), FINGERPRINT, layout())
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory to another user")
def test_a_cache_directory_of_another_user_is_left_as_it_is(tmp_path):
    directory = tmp_path / "kv"
    directory.mkdir()
    os.chmod(directory, 0o775)
    os.chown(directory, 54321, -1)
    KVStore(StoreConfig(directory), FINGERPRINT, layout())
    assert stat.S_IMODE(directory.stat().st_mode) == 0o775


def test_a_directory_planted_at_an_entrys_name_is_left_alone_and_the_entry_saved_beside_it(tmp_path, caplog):
    """Item 10: a directory at `c-den.<tag>.kv` failed every save of that conversation (os.replace onto a
    directory), an ERROR line every turn. Now it is left as it is, the entry is saved as `c-den.<tag>-1.kv`
    (logged once), lookups by the conversation's id find it there, and `kv ls|evict` name it so."""
    caplog.set_level(logging.INFO, logger="genie.kvstore")
    directory = tmp_path / "kv"
    server = KVStoreServer(ServerConfig(f"ipc://{tmp_path}/kv.sock", StoreConfig(directory)))
    try:
        tag = server._store(FINGERPRINT.hex(), layout()).tag
        planted = directory / f"c-den.{tag}.kv"
        planted.mkdir()
        (planted / "inside").write_bytes(b"kept")
        for seed in range(3):  # three turns of the conversation, each saved and found again
            reply = save(server, "den", seed)
            assert isinstance(reply, KvSaved), reply
            rng = np.random.default_rng(seed)
            ids = [int(t) for t in rng.integers(0, 1000, N_TOKENS)]
            lookup = KvLookup(
                request_id="l",
                fingerprint=FINGERPRINT.hex(),
                layout=layout_body(layout()),
                token_ids=ids + [5],
                conv_id="den",
            )
            data, frames = ask(server, lookup)
            assert isinstance(data, KvData) and data.n_tokens == N_TOKENS and frames, data
        assert (planted / "inside").read_bytes() == b"kept"
        assert sorted(p.name for p in directory.glob("*.kv")) == [f"c-den.{tag}-1.kv", planted.name]
        listed, _ = ask(server, KvList(request_id="ls"))
        assert isinstance(listed, Reply) and [e["id"] for e in listed.data["entries"]] == [f"c-den.{tag}-1"]
        assert listed.data["entries"][0]["conv_id"] == "den"
        evicted, _ = ask(server, KvEvict(request_id="ev", entry_id=f"c-den.{tag}-1"))
        assert isinstance(evicted, Reply) and evicted.data["evicted"] is True and planted.is_dir()
    finally:
        server.sock.close()
        server.ctx.term()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    about = [r.getMessage() for r in caplog.records if repr(planted.name) in r.getMessage()]
    assert len([m for m in about if "kv_left_alone" in m]) == 1, about
    assert len([m for m in about if "kv_saved_as" in m]) == 1, about


def test_a_save_whose_every_name_is_taken_fails_as_a_value_and_replaces_nothing(tmp_path):
    store = KVStore(StoreConfig(tmp_path / "kv"), FINGERPRINT, layout())
    names = store._names("c", "den")
    for name in names:
        (store.dir / name).mkdir()
    rng = np.random.default_rng(0)
    got = store.save(snapshot(layout(), rng.integers(0, 1000, N_TOKENS), rng), conv_id="den")
    assert isinstance(got, NotSaved) and got.code == "kv_name_taken", got
    assert store.metrics.save_failures == 1 and all((store.dir / n).is_dir() for n in names)
