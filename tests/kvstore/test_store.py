"""KVStore: save and hydrate by conversation id or by prompt, LRU size cap, stale temp files, bad files,
and several processes on one directory."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from genie_kvstore.format import entry_bytes, read_entry, read_header, write_entry
from genie_kvstore.store import CHUNK_TOKENS, KVStore, NotSaved, StoreConfig
from testkit.draws import drawn_rng
from tests.kvstore.kv_data import FINGERPRINT, OTHER_MODEL, assert_same, layout, snapshot

ROOT = Path(__file__).parents[2]


def make_store(tmp_path: Path, **kw) -> KVStore:
    return KVStore(StoreConfig(tmp_path / "kv", **kw), FINGERPRINT, layout())


def ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 30_000, n).astype(np.int32)


def test_conversation_id_round_trip_and_longest_prefix(tmp_path):
    rng = drawn_rng()
    store = make_store(tmp_path)
    turn1 = ids(rng, 200)
    snap = snapshot(store.layout, turn1, rng)
    store.save(snap, conv_id="kitchen-1")
    turn2 = np.concatenate([turn1, ids(rng, 30)])
    got = store.hydrate(turn2, conv_id="kitchen-1")
    assert got is not None
    assert_same(snap, got)
    edited = turn2.copy()
    edited[150] += 1  # the history changed at 150: only [0, 150) is served
    got = store.hydrate(edited, conv_id="kitchen-1")
    assert got is not None and got.n_tokens == 150
    assert store.metrics.hits == 2 and store.metrics.hydrated_tokens == 350


def test_found_from_the_prompt_without_an_id(tmp_path):
    rng = drawn_rng()
    store = make_store(tmp_path)
    history = ids(rng, 3 * CHUNK_TOKENS + 10)
    snap = snapshot(store.layout, history, rng)
    store.save(snap)
    prompt = np.concatenate([history, ids(rng, 30)])
    assert_same(snap, store.hydrate(prompt))
    # chunk hashes match through chunk 2; the tokens differ after position 200: verified, not trusted
    diverging = prompt.copy()
    diverging[200] ^= 1
    got = store.hydrate(diverging)
    assert got is not None and got.n_tokens == 200
    assert store.hydrate(ids(rng, 300)) is None  # nothing in common
    assert store.hydrate(history[: CHUNK_TOKENS - 1]) is None  # shorter than one chunk: not worth a read
    assert store.metrics.misses == 2


def test_shared_system_prompt_is_reused_and_superseded_entries_dropped(tmp_path):
    rng = drawn_rng()
    store = make_store(tmp_path)
    system = ids(rng, 2 * CHUNK_TOKENS)
    a1 = np.concatenate([system, ids(rng, 40)])
    store.save(snapshot(store.layout, a1, rng))
    a2 = np.concatenate([a1, ids(rng, 50)])
    store.save(snapshot(store.layout, a2, rng))
    assert [e["tokens"] for e in store.entries()] == [len(a2)]  # a1 is a prefix of a2: dropped
    other = np.concatenate([system, ids(rng, 60)])
    got = store.hydrate(other)
    assert got is not None and got.n_tokens == len(system)


@pytest.mark.parametrize("bad", ["", "../etc/passwd", "a/b", "x" * 129, ".hidden", "a..b", "sp ace", "ü"])
def test_conversation_ids_are_validated(tmp_path, bad):
    rng = drawn_rng()
    store = make_store(tmp_path)
    snap = snapshot(store.layout, [1, 2, 3], rng)
    with pytest.raises(ValueError, match="conv id"):
        store.save(snap, conv_id=bad) if bad else store.lookup([1, 2, 3], conv_id="/" + bad)
    assert list((tmp_path / "kv").glob("*.kv")) == []


def test_lru_cap_counts_hydrating_as_use(tmp_path):
    rng = drawn_rng()
    store = make_store(tmp_path)
    saved = {}
    for name in "abc":
        saved[name] = ids(rng, 100)
        store.save(snapshot(store.layout, saved[name], rng), conv_id=name)
        time.sleep(0.01)
    entry_bytes = store.entries()[0]["bytes"]
    assert store.hydrate(saved["a"], conv_id="a") is not None  # a is now the most recently used
    store.config = StoreConfig(store.dir, max_bytes=3 * entry_bytes)
    store.save(snapshot(store.layout, ids(rng, 100), rng), conv_id="d")
    assert sorted(e["conv_id"] for e in store.entries()) == ["a", "c", "d"]  # b was least recently used
    assert store.metrics.evictions == 1
    assert sum(p.stat().st_size for p in store.dir.glob("*.kv")) <= 3 * entry_bytes


def test_stale_temp_files_removed_exactly(tmp_path):
    rng = drawn_rng()
    store = make_store(tmp_path, stale_tmp_s=60)
    old = store.dir / ".c-x.kv.999.tmp"
    fresh = store.dir / ".c-y.kv.998.tmp"
    for p in (old, fresh):
        p.write_bytes(b"partial")
    past = time.time() - 61
    os.utime(old, (past, past))
    store.save(snapshot(store.layout, [1, 2], rng), conv_id="z")
    assert not old.exists() and fresh.exists()


def test_bad_and_foreign_files_are_misses_never_served(tmp_path, caplog):
    rng = drawn_rng()
    store = make_store(tmp_path)
    history = ids(rng, 100)
    good_snap = snapshot(store.layout, history, rng)
    good = store.save(good_snap, conv_id="good").path
    blob = bytearray(good.read_bytes())
    blob[-100] ^= 1

    def named(conv: str) -> Path:
        return store.dir / store._name("c", conv)

    named("flipped").write_bytes(bytes(blob))
    named("short").write_bytes(good.read_bytes()[:500])
    # another model's sound file under this model's name (planted: real ones carry their own tag)
    write_entry(named("other"), OTHER_MODEL, store.layout, snapshot(store.layout, history, rng), "other")
    for conv in ("flipped", "short", "other"):  # the flipped header is fine: the checksum catches it
        got = store.hydrate(history, conv_id=conv)
        assert_same(good_snap, got)  # what is served is the sound entry of the same tokens, found by its chunks
    reasons = " ".join(r.getMessage() for r in caplog.records)
    assert "checksum" in reasons and "truncated" in reasons and "another model" in reasons
    assert not named("flipped").exists() and not named("short").exists()
    assert named("other").exists()  # the other model's, left to it
    named("good").unlink()
    named("good2").write_bytes(bytes(blob))
    assert store.hydrate(history, conv_id="good2") is None  # with no sound copy: a miss
    assert store.metrics.rejected == 4


def test_thousand_corrupted_entries_each_a_miss_with_its_reason(tmp_path, caplog):
    """1 000 bad files named as conversations: each is rejected with a log line naming why, never served;
    every request is answered from the sound entry of the same tokens. Genie's files are removed; those
    whose magic is not genie's are a stranger's, and left alone (issue 21 item 4)."""
    from tests.kvstore.test_format import corrupt

    rng = np.random.default_rng(11)
    store = make_store(tmp_path)
    history = ids(rng, 100)
    good_snap = snapshot(store.layout, history, rng)
    good = store.save(good_snap, conv_id="good").path.read_bytes()
    for i in range(1000):
        blob, _ = corrupt(good, i % 6, rng)
        (store.dir / store._name("c", f"bad{i}")).write_bytes(blob)
    caplog.clear()
    for i in range(1000):  # the same tokens as the good entry: whatever is served must be the good one
        assert_same(good_snap, store.hydrate(history, conv_id=f"bad{i}"))
    strangers = {store._name("c", f"bad{i}") for i in range(1000) if i % 6 == 4}  # corrupt() kind 4: bad magic
    rejected = [r.getMessage() for r in caplog.records if "kv_rejected" in r.getMessage()]
    assert len(rejected) == 1000 - len(strangers) and all("reason=" in m for m in rejected)
    left = [r.getMessage() for r in caplog.records if "kv_left_alone" in r.getMessage()]
    assert len(left) == len(strangers) and all("magic" in m for m in left)
    assert store.metrics.rejected == 1000
    assert {p.name for p in store.dir.glob("*.kv")} == {store._name("c", "good")} | strangers
    assert_same(good_snap, store.hydrate(history, conv_id="good"))


def test_index_rebuilt_at_start_and_other_processes_saves_seen(tmp_path):
    rng = drawn_rng()
    a, b = make_store(tmp_path), make_store(tmp_path)
    history = ids(rng, 2 * CHUNK_TOKENS)
    snap = snapshot(a.layout, history, rng)
    a.save(snap)
    assert_same(snap, b.hydrate(history))  # b learns of a's save by the directory's mtime
    assert_same(snap, make_store(tmp_path).hydrate(history))  # a new store rebuilds from the headers


def test_admin_list_evict_clear(tmp_path):
    rng = drawn_rng()
    store = make_store(tmp_path)
    store.save(snapshot(store.layout, ids(rng, 70), rng), conv_id="one")
    store.save(snapshot(store.layout, ids(rng, 70), rng))
    listed = store.entries()
    assert {e["id"][:2] for e in listed} == {"c-", "t-"}
    one = next(e["id"] for e in listed if e["conv_id"] == "one")
    assert one == f"c-one.{store.tag}"
    assert store.evict(one) and not store.evict(one)
    with pytest.raises(ValueError):
        store.evict("../../x")
    assert store.clear() == 1 and store.entries() == []


WORKER = """
import sys, numpy as np, random
from pathlib import Path
sys.path.insert(0, {root!r})
from genie_kvstore.store import KVStore, StoreConfig
from tests.kvstore.kv_data import FINGERPRINT, layout, snapshot
directory, seed, n_ops, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed)
r = random.Random(seed)
store = KVStore(StoreConfig(Path(directory), max_bytes=cap, stale_tmp_s=10), FINGERPRINT, layout())
for i in range(n_ops):
    op = r.random()
    conv = f"p{{seed}}-{{r.randrange(20)}}"
    if op < 0.6:
        n = r.randrange(1, 300)
        path = store.save(snapshot(store.layout, rng.integers(0, 1000, n), rng), conv_id=conv)
    elif op < 0.9:
        store.hydrate(rng.integers(0, 1000, 100), conv_id=conv)
    elif op < 0.97:
        store.evict(f"c-{{conv}}.{{store.tag}}")
    else:
        store.entries()
print("ok", store.metrics.saves, store.metrics.evictions)
"""


def plant_temp_files(directory: Path) -> tuple[list[Path], list[Path]]:
    """Temp files of crashed saves (an hour old) and of saves in flight (mtime an hour ahead, so they never
    age past stale_tmp_s during the run), plus a stranger's file that is no temp file."""
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    old = [directory / f".c-crashed{i}.kv.{900 + i}.tmp" for i in range(5)]
    live = [directory / f".c-writing{i}.kv.{800 + i}.tmp" for i in range(5)]
    for p, t in [(p, now - 3600) for p in old] + [(p, now + 3600) for p in live]:
        p.write_bytes(b"partial")
        os.utime(p, (t, t))
    (directory / "notes.txt").write_text("not ours")
    return old, live


def run_writers(tmp_path: Path, n_procs: int, n_ops: int, cap: int) -> list[str]:
    script = tmp_path / "writer.py"
    script.write_text(WORKER.format(root=str(ROOT)))
    directory = tmp_path / "shared"
    old, live = plant_temp_files(directory)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(directory), str(seed), str(n_ops), str(cap)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(n_procs)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(out)
    assert not any(p.exists() for p in old) and all(p.exists() for p in live)  # exactly the old ones went
    assert (directory / "notes.txt").exists()
    for p in live:
        p.unlink()
    return outs


def check_directory(directory: Path, cap: int) -> None:
    total = 0
    for p in directory.glob("*.kv"):
        h = read_header(p)  # every entry left is whole and valid
        read_entry(h, h.n_tokens)
        total += h.file_bytes
    assert total <= cap, f"{total} bytes over the cap {cap}"


@pytest.mark.parametrize("n_ops", [250])
def test_four_processes_share_one_directory(tmp_path, n_ops):
    """4 processes x 250 seeded operations (CI); the soak variant runs 10 000 in all."""
    cap = 40 * layout().body_bytes(150)
    outs = run_writers(tmp_path, 4, n_ops, cap)
    assert all(o.startswith("ok") for o in outs)
    check_directory(tmp_path / "shared", cap)
    assert not list((tmp_path / "shared").glob(".*.tmp"))  # nobody crashed: no temp file left


@pytest.mark.soak
def test_four_processes_share_one_directory_long(tmp_path):
    cap = 40 * layout().body_bytes(150)
    run_writers(tmp_path, 4, 2500, cap)
    check_directory(tmp_path / "shared", cap)


def test_an_entry_larger_than_the_cap_is_not_saved_and_evicts_nothing(tmp_path):
    rng = drawn_rng()
    store = make_store(tmp_path)
    small = store.save(snapshot(store.layout, ids(rng, 70), rng), conv_id="small")
    assert small is not None
    store.config = StoreConfig(store.dir, max_bytes=small.bytes + 1000)
    big = store.save(snapshot(store.layout, ids(rng, 700), rng), conv_id="big")
    assert isinstance(big, NotSaved) and big.code == "kv_too_large"
    assert [e["conv_id"] for e in store.entries()] == ["small"] and store.metrics.skipped == 1


def test_entry_replaced_after_lookup_is_a_miss_not_a_deletion(tmp_path):
    """Another process saves the same conversation again between our lookup and our read: the new file
    is neither served against the old header nor deleted as corrupt."""
    rng = drawn_rng()
    a, b = make_store(tmp_path), make_store(tmp_path)
    first = ids(rng, 100)
    a.save(snapshot(a.layout, first, rng), conv_id="x")
    match = a.lookup(first, conv_id="x")
    assert match is not None
    second = snapshot(b.layout, ids(rng, 100), rng)  # same size, other tokens
    b.save(second, conv_id="x")
    assert a.load(match) is None
    assert match.header.path.exists() and a.metrics.rejected == 0
    assert_same(second, a.hydrate(second.token_ids, conv_id="x"))


def test_files_are_private_and_models_do_not_share_names(tmp_path):
    rng = drawn_rng()
    int8 = make_store(tmp_path)
    f16 = KVStore(StoreConfig(tmp_path / "kv"), FINGERPRINT, layout("f16"))
    history = ids(rng, 100)
    p8 = int8.save(snapshot(int8.layout, history, rng), conv_id="same").path
    p16 = f16.save(snapshot(f16.layout, history, rng), conv_id="same").path
    assert p8 != p16 and p8.exists() and p16.exists()
    assert (p8.stat().st_mode & 0o777) == 0o600 and (int8.dir.stat().st_mode & 0o777) == 0o700
    assert int8.hydrate(history, conv_id="same").dtype == "int8"
    assert f16.hydrate(history, conv_id="same").dtype == "f16"
    assert int8.metrics.rejected == f16.metrics.rejected == 0


def test_file_names_from_the_directory_are_escaped_in_the_log(tmp_path, caplog):
    """A newline in a file name must not forge a log line (issue 21 item 8)."""
    rng = np.random.default_rng(3)
    store = make_store(tmp_path)
    saved = store.save(snapshot(store.layout, ids(rng, 100), rng), conv_id="a")
    blob = saved.path.read_bytes()
    (store.dir / f"t-x\nevent=kv_forged.{store.tag}.kv").write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    (store.dir / f"t-y\nevent=kv_forged.{store.tag}.kv").write_bytes(blob[:300])
    store.config = StoreConfig(store.dir, max_bytes=2 * saved.bytes)
    caplog.set_level(logging.INFO, logger="genie.kvstore")
    for i in range(3):  # rejected on a rescan, or evicted: logged either way
        store.save(snapshot(store.layout, ids(rng, 100), rng), conv_id=f"b{i}")
        store.hydrate(ids(rng, 300))
    messages = [r.getMessage() for r in caplog.records]
    assert any("kv_forged" in m for m in messages)
    assert not any("\n" in m for m in messages), messages


SAVER = """
import sys, numpy as np
from pathlib import Path
sys.path.insert(0, {root!r})
from genie_kvstore.store import KVStore, StoreConfig
from tests.kvstore.kv_data import FINGERPRINT, layout, snapshot
directory, seed, n_saves, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed)
store = KVStore(StoreConfig(Path(directory), max_bytes=cap), FINGERPRINT, layout())
for i in range(n_saves):
    store.save(snapshot(store.layout, rng.integers(0, 1000, {n_tokens}), rng), conv_id=f"w{{seed}}-{{i}}")
"""


def test_several_writers_never_exceed_the_cap_by_more_than_one_entry(tmp_path):
    """Sampled while 4 processes save entries of one size under a cap of 3: each made room after its write,
    and the directory held up to 1.8x the cap (issue 21 item 8)."""
    n_tokens, n_saves = 1000, 25
    entry = make_store(tmp_path).save(snapshot(layout(), np.arange(n_tokens), drawn_rng()), "probe")
    cap = 3 * entry.bytes
    script = tmp_path / "saver.py"
    script.write_text(SAVER.format(root=str(ROOT), n_tokens=n_tokens))
    directory = tmp_path / "shared"
    procs = [
        subprocess.Popen([sys.executable, str(script), str(directory), str(seed), str(n_saves), str(cap)])
        for seed in range(4)
    ]
    most = 0
    deadline = time.monotonic() + 300  # hang guard
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        total = 0
        for p in directory.glob("*.kv") if directory.exists() else []:
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                continue
        most = max(most, total)
    for p in procs:
        assert p.wait(timeout=60) == 0
    assert 0 < most <= cap + entry.bytes, f"{most / cap:.2f}x the cap"


def test_an_anonymous_entry_makes_room_by_dropping_what_it_supersedes(tmp_path):
    """Room for the next turn of a conversation without an id (Home Assistant's) comes from its previous
    turn's entry, which it supersedes, not from the least recently used other conversation."""
    rng = np.random.default_rng(4)
    store = make_store(tmp_path)
    other = store.save(snapshot(store.layout, ids(rng, 100), rng), conv_id="other")
    turn1 = ids(rng, 2 * CHUNK_TOKENS)
    store.save(snapshot(store.layout, turn1, rng))
    turn2 = np.concatenate([turn1, ids(rng, 50)])
    store.config = StoreConfig(store.dir, max_bytes=other.bytes + entry_bytes(store.layout, "", len(turn2)))
    store.save(snapshot(store.layout, turn2, rng))
    assert sorted((e["conv_id"], e["tokens"]) for e in store.entries()) == [("", len(turn2)), ("other", 100)]
    assert store.metrics.evictions == 0
