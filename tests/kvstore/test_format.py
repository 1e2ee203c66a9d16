"""Format v4: exact round trips, and every kind of bad file is an EntryError with its reason."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from genie_kvstore.format import (
    CHECKSUM_BYTES,
    EntryError,
    ForeignEntryError,
    check_compatible,
    read_entry,
    read_header,
    write_entry,
)
from testkit.draws import drawn_rng
from tests.kvstore.kv_data import FINGERPRINT, OTHER_MODEL, assert_same, layout, mixed_layout, snapshot


@pytest.mark.parametrize("mixed", [False, True], ids=["uniform", "mixed-pools"])
@pytest.mark.parametrize("dtype", ["int8", "f16", "f32"])
def test_round_trip_whole_and_prefix(tmp_path, dtype, mixed):
    rng = drawn_rng()
    lay = mixed_layout(dtype) if mixed else layout(dtype)
    snap = snapshot(lay, rng.integers(0, 50_000, 150), rng)
    path = tmp_path / "c-x.kv"
    size = write_entry(path, FINGERPRINT, lay, snap, conv_id="x", created_ns=123)
    assert size == path.stat().st_size
    h = read_header(path)
    assert (h.fingerprint, h.layout, h.conv_id, h.created_ns, h.n_tokens) == (FINGERPRINT, lay, "x", 123, 150)
    assert h.last_used_ns > 123
    check_compatible(h, FINGERPRINT, lay)
    assert_same(snap, read_entry(h, 150))
    assert_same(snap, read_entry(h, 77), 77)
    assert [p.name for p in tmp_path.iterdir()] == ["c-x.kv"]  # no temp file left


def test_foreign_model_and_layout_are_foreign(tmp_path):
    rng = drawn_rng()
    lay = layout()
    write_entry(tmp_path / "a.kv", OTHER_MODEL, lay, snapshot(lay, [1, 2, 3], rng))
    h = read_header(tmp_path / "a.kv")
    with pytest.raises(ForeignEntryError, match="another model"):
        check_compatible(h, FINGERPRINT, lay)
    with pytest.raises(ForeignEntryError, match="KV layout"):
        check_compatible(h, OTHER_MODEL, layout(head_dim=32))
    with pytest.raises(ForeignEntryError, match="KV layout"):
        check_compatible(h, OTHER_MODEL, mixed_layout())


def corrupt(data: bytes, kind: int, rng: np.random.Generator) -> tuple[bytes, str]:
    """One seeded corruption of a good file, and the reason it must be rejected with."""
    b = bytearray(data)
    if kind == 0:
        return bytes(b[: rng.integers(0, len(b))]), "truncated|size"
    if kind == 1:
        header_bytes = struct.unpack_from("<I", b, 12)[0]
        i = int(rng.integers(header_bytes, len(b)))  # in the body or the checksum: only the checksum can tell
        b[i] ^= 1 << int(rng.integers(0, 8))
        return bytes(b), "checksum"
    if kind == 2:  # a length field at 0xFFFFFFF0
        off = {0: 12, 1: 56, 2: 60, 3: 80}[int(rng.integers(0, 4))]  # header size, pools, tokens, 1st KV heads
        struct.pack_into("<I", b, off, 0xFFFFFFF0)
        return bytes(b), "out of range|header size"
    if kind == 3:
        struct.pack_into("<I", b, 8, 99)
        return bytes(b), "version 99"
    if kind == 4:
        b[0:8] = b"GGUF\x03\x00\x00\x00"
        return bytes(b), "bad magic"
    return bytes(b) + bytes(int(rng.integers(1, 100))), "size"


def test_thousand_corrupted_files_each_rejected_with_its_reason(tmp_path):
    rng = np.random.default_rng(5)
    lay = layout()
    good = tmp_path / "good.kv"
    write_entry(good, FINGERPRINT, lay, snapshot(lay, rng.integers(0, 1000, 100), rng))
    data = good.read_bytes()
    bad = tmp_path / "bad.kv"
    for i in range(1000):
        blob, reason = corrupt(data, i % 6, rng)
        bad.write_bytes(blob)
        with pytest.raises(EntryError, match=reason):
            read_entry(read_header(bad), 1)


def test_header_checks_run_before_any_allocation(tmp_path):
    """Token count and layer count at their limits in a tiny file: refused on size, nothing allocated."""
    lay = layout()
    path = tmp_path / "h.kv"
    write_entry(path, FINGERPRINT, lay, snapshot(lay, [5] * 10, drawn_rng()))
    b = bytearray(path.read_bytes())
    struct.pack_into("<I", b, 60, 1 << 20)  # the most tokens a file may hold, in a 2 kB file
    path.write_bytes(bytes(b))
    with pytest.raises(EntryError, match="truncated|size"):
        read_header(path)


def test_checksum_covers_the_last_byte_before_it(tmp_path):
    lay = layout("f16")
    path = tmp_path / "e.kv"
    write_entry(path, FINGERPRINT, lay, snapshot(lay, [1, 2], drawn_rng()))
    b = bytearray(path.read_bytes())
    b[-CHECKSUM_BYTES - 1] ^= 0x80
    path.write_bytes(bytes(b))
    with pytest.raises(EntryError, match="checksum"):
        read_entry(read_header(path), 2)


def test_streamed_checksum_equals_the_parallel_one(monkeypatch):
    """The writer feeds pieces of any size; the reader checks chunks in parallel: the same digest."""
    import genie_kvstore.format as fmt

    monkeypatch.setattr(fmt, "CHECKSUM_CHUNK", 1000)
    data = drawn_rng().bytes(10_500)
    streamed = fmt._ChunkCrcs()
    at = 0
    for size in (1, 999, 1, 2500, 7, 6992):  # pieces across chunk boundaries, ending mid-chunk
        streamed.update(data[at : at + size])
        at += size
    assert at == len(data)
    assert streamed.digest() == fmt.checksum(memoryview(data))
    flipped = bytearray(data)
    flipped[5000] ^= 4
    assert fmt.checksum(memoryview(bytes(flipped))) != streamed.digest()
