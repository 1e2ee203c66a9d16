"""KV entry files, format v4 (docs/kv-format.md): one conversation's KV for positions [0, n).

    fixed header | per-pool shapes and windows | conv id | token ids | padding to 64 | body | scales | checksum

Every field is checked before it is trusted: a file that is truncated, padded, bit-flipped, of another
version, another model (fingerprint) or another KV layout raises EntryError with the reason, and is never
served. Lengths are checked against limits and against the file's actual size before anything is
allocated from them. A file is opened only as a regular file (open_entry); one that is not, or whose magic
is not genie's, raises NotAnEntry: not genie's, so never deleted either.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from genie_common.atomic_file import atomic_path
from genie_common.kv_types import KVCacheConfig, KVSnapshot

MAGIC = b"GENIEKV\x00"
VERSION = 4
FIXED = struct.Struct("<8sIII32sBBHIIQQ")  # see docs/kv-format.md for each field
POOL = struct.Struct("<IIII")  # per pool: KV heads, K head dim, V head dim, sliding window
ALIGN = 64
CHECKSUM_BYTES = 32  # sha256 of the CRC-32s of every CHECKSUM_CHUNK bytes before it
CHECKSUM_CHUNK = 4 << 20  # chunks checked in parallel on read: a hydrate is not bound by one core's CRC speed
DTYPE_CODES = {"int8": 1, "f16": 2, "f32": 3}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
NUMPY_DTYPES = {"int8": np.int8, "f16": np.float16, "f32": np.float32}
BASIS_PLAIN, BASIS_HADAMARD = 0, 1  # INT8 rows are stored in the kv_rotation basis (docs/kv-cache.md)
MAX_LAYERS, MAX_KV_HEADS, MAX_HEAD_DIM = 1024, 1024, 4096
MAX_TOKENS = 1 << 20
MAX_CONV_ID_BYTES = 128


class EntryError(Exception):
    """An entry file that must not be served; the message says why, in a few words."""


class ForeignEntryError(EntryError):
    """A sound entry of another model or KV layout: never served here, but not ours to delete."""


class NotAnEntry(ForeignEntryError):
    """Not genie's at all: not a regular file (a symlink, a directory, a FIFO), or one whose first bytes are
    not genie's magic. Never served, and never deleted: whoever put it there owns it."""


class EntryUnavailable(EntryError):
    """The file could not be read now (I/O error, too many open files) or was replaced since its header
    was read: a miss, but nothing says the file is bad, so it is kept."""


@dataclass(frozen=True)
class KVLayout:
    """What KV a file holds must equal what the worker's cache holds, field by field: per pool (a layer that
    writes K/V; Gemma 4's shared layers have none) its KV heads, K and V head dims and sliding window."""

    dtype: str  # int8 | f16 | f32
    n_kv_heads: tuple[int, ...]
    head_dim: tuple[int, ...]
    v_head_dim: tuple[int, ...]
    windows: tuple[int, ...]  # 0 = global attention, else the sliding window

    def __post_init__(self) -> None:
        if not len(self.windows) == len(self.n_kv_heads) == len(self.head_dim) == len(self.v_head_dim):
            raise ValueError("a KV layout needs every field for every pool")

    @classmethod
    def uniform(
        cls, dtype: str, n_layers: int, n_kv_heads: int, head_dim: int, v_head_dim: int, windows: tuple[int, ...]
    ) -> KVLayout:
        return cls(dtype, (n_kv_heads,) * n_layers, (head_dim,) * n_layers, (v_head_dim,) * n_layers, tuple(windows))

    @classmethod
    def of(cls, kv: KVCacheConfig, windows: tuple[int, ...]) -> KVLayout:
        """The layout of a worker's KV cache (windows: each pool's sliding window, 0 = global)."""
        n_kv, hd, hdv = zip(*(kv.pool_shape(i) for i in range(kv.n_layers)), strict=True)
        return cls(kv.dtype, n_kv, hd, hdv, tuple(windows))

    @property
    def n_layers(self) -> int:
        return len(self.windows)

    def pool(self, i: int) -> tuple[int, int, int]:
        """(n_kv_heads, head_dim, v_head_dim) of pool i."""
        return self.n_kv_heads[i], self.head_dim[i], self.v_head_dim[i]

    @property
    def basis(self) -> int:
        return BASIS_HADAMARD if self.dtype == "int8" else BASIS_PLAIN

    def body_bytes(self, n_tokens: int) -> int:
        item = np.dtype(NUMPY_DTYPES[self.dtype]).itemsize
        total = 0
        for n_kv, hd, hdv in map(self.pool, range(self.n_layers)):
            total += n_tokens * n_kv * (hd + hdv) * item + (2 * n_tokens * n_kv * 4 if self.dtype == "int8" else 0)
        return total


@dataclass(frozen=True)
class EntryHeader:
    path: Path
    fingerprint: bytes
    layout: KVLayout
    conv_id: str  # "" when the entry was saved without one
    token_ids: np.ndarray  # int32 [n_tokens]
    created_ns: int  # first save of this conversation
    last_used_ns: int  # this save
    header_bytes: int
    file_bytes: int
    raw: bytes = b""  # the header's bytes as read: read_entry checks the file it maps still has them

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])


def entry_bytes(layout: KVLayout, conv_id: str, n_tokens: int) -> int:
    """The size of the file write_entry makes for these."""
    return _header_bytes(layout, conv_id.encode(), n_tokens) + layout.body_bytes(n_tokens) + CHECKSUM_BYTES


def _header_bytes(layout: KVLayout, conv_id: bytes, n_tokens: int) -> int:
    raw = FIXED.size + POOL.size * layout.n_layers + len(conv_id) + 4 * n_tokens
    return -(-raw // ALIGN) * ALIGN


class _ChunkCrcs:
    """The checksum of a byte stream fed in pieces of any size (what checksum() gives for the whole)."""

    def __init__(self) -> None:
        self.crcs: list[int] = []
        self.crc = 0
        self.filled = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), CHECKSUM_CHUNK - self.filled)
            self.crc = zlib.crc32(view[:take], self.crc)
            self.filled += take
            view = view[take:]
            if self.filled == CHECKSUM_CHUNK:
                self.crcs.append(self.crc)
                self.crc, self.filled = 0, 0

    def digest(self) -> bytes:
        tail = [self.crc] if self.filled else []
        return hashlib.sha256(struct.pack(f"<{len(self.crcs) + len(tail)}I", *self.crcs, *tail)).digest()


_pool: ThreadPoolExecutor | None = None


def checksum(data: memoryview) -> bytes:
    """sha256 over the little-endian CRC-32 of each CHECKSUM_CHUNK bytes (the last chunk may be shorter);
    the chunks' CRCs run on a thread pool (zlib releases the GIL)."""
    global _pool
    chunks = [data[i : i + CHECKSUM_CHUNK] for i in range(0, len(data), CHECKSUM_CHUNK)]
    if len(chunks) > 1:
        if _pool is None:
            _pool = ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="kv-crc")
        crcs = list(_pool.map(zlib.crc32, chunks))
    else:
        crcs = [zlib.crc32(c) for c in chunks]
    return hashlib.sha256(struct.pack(f"<{len(crcs)}I", *crcs)).digest()


def write_entry(
    path: Path,
    fingerprint: bytes,
    layout: KVLayout,
    snapshot: KVSnapshot,
    conv_id: str = "",
    created_ns: int | None = None,
) -> int:
    """Writes `snapshot` durably (atomic_path): returns the file's size. The caller holds the layout."""
    n = snapshot.n_tokens
    cid = conv_id.encode()
    if snapshot.dtype != layout.dtype or len(snapshot.k) != layout.n_layers:
        raise ValueError("snapshot does not match the layout")
    if len(fingerprint) != 32 or len(cid) > MAX_CONV_ID_BYTES or not 0 < n <= MAX_TOKENS:
        raise ValueError("fingerprint, conv id or token count out of range")
    now = time.time_ns()
    header_bytes = _header_bytes(layout, cid, n)
    fixed = FIXED.pack(
        MAGIC,
        VERSION,
        header_bytes,
        0,
        fingerprint,
        DTYPE_CODES[layout.dtype],
        layout.basis,
        len(cid),
        layout.n_layers,
        n,
        created_ns or now,
        now,
    )
    pools = b"".join(POOL.pack(*layout.pool(i), layout.windows[i]) for i in range(layout.n_layers))
    ids = np.ascontiguousarray(snapshot.token_ids, dtype="<i4").tobytes()
    pieces: list[bytes | memoryview] = [b"".join([fixed, pools, cid, ids]).ljust(header_bytes, b"\0")]
    for k, v in zip(snapshot.k, snapshot.v, strict=True):
        pieces += [np.ascontiguousarray(k).data.cast("B"), np.ascontiguousarray(v).data.cast("B")]
    if layout.dtype == "int8":
        assert snapshot.k_scale is not None and snapshot.v_scale is not None
        for ks, vs in zip(snapshot.k_scale, snapshot.v_scale, strict=True):
            pieces += [
                np.ascontiguousarray(ks, dtype="<f4").data.cast("B"),
                np.ascontiguousarray(vs, dtype="<f4").data.cast("B"),
            ]
    crcs = _ChunkCrcs()
    size = 0
    with atomic_path(path, durable=True, mode=0o600) as tmp, open(tmp, "wb") as f:
        for piece in pieces:
            crcs.update(piece)
            f.write(piece)
            size += len(piece)
        f.write(crcs.digest())
    expected = header_bytes + layout.body_bytes(n)
    assert size == expected, (size, expected)
    return size + CHECKSUM_BYTES


def open_entry(path: Path) -> BinaryIO:
    """An entry file opened for reading, only if it is a regular file: never through a symlink, and without
    blocking on a FIFO (a `*.kv` FIFO in the cache directory blocked the store in open() for ever, issue 21
    item 4). NotAnEntry for anything else; OSError when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a symlink; a socket
            raise NotAnEntry("not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAnEntry("not a regular file")
        return os.fdopen(fd, "rb")  # (O_NONBLOCK changes nothing for a regular file)
    except BaseException:
        os.close(fd)
        raise


def is_genie_file(path: Path) -> bool:
    """Whether the regular file at `path` begins with genie's magic, or with part of it (an entry cut short is
    still genie's, to reject); NotAnEntry or OSError as open_entry."""
    with open_entry(path) as f:
        head = f.read(len(MAGIC))
    return head == MAGIC[: len(head)]


def read_header(path: Path) -> EntryHeader:
    """The header of an entry, every field range-checked against limits and the file's size (the body and
    checksum are checked by read_entry)."""
    try:
        with open_entry(path) as f:
            file_bytes = os.fstat(f.fileno()).st_size
            fixed = f.read(FIXED.size)
            head = fixed[: len(MAGIC)]
            if head != MAGIC[: len(head)]:
                raise NotAnEntry("bad magic: not a genie KV file")
            if len(fixed) < FIXED.size:
                raise EntryError(f"truncated: {file_bytes} bytes, not even a header")
            (
                _magic,  # checked above, before the length: a short stranger's file is not a truncated entry
                version,
                header_bytes,
                _flags,
                fingerprint,
                dtype_code,
                basis,
                cid_len,
                n_layers,
                n_tokens,
                created_ns,
                last_used_ns,
            ) = FIXED.unpack(fixed)
            if version != VERSION:
                raise EntryError(f"version {version} (this genie reads {VERSION})")
            dtype = DTYPE_NAMES.get(dtype_code)
            if dtype is None:
                raise EntryError(f"unknown KV dtype code {dtype_code}")
            if not (0 < n_layers <= MAX_LAYERS and 0 < n_tokens <= MAX_TOKENS and cid_len <= MAX_CONV_ID_BYTES):
                raise EntryError("a layout field is out of range")
            pools_raw = f.read(POOL.size * n_layers)
            cid_raw = f.read(cid_len)
            ids_raw = f.read(4 * n_tokens)
        if len(pools_raw) < POOL.size * n_layers or len(cid_raw) < cid_len or len(ids_raw) < 4 * n_tokens:
            raise EntryError(f"truncated: {file_bytes} bytes, the header does not fit")
    except OSError as e:
        raise EntryUnavailable(f"unreadable: {e.strerror}") from None
    pools = [POOL.unpack_from(pools_raw, POOL.size * i) for i in range(n_layers)]
    if not all(
        0 < kv <= MAX_KV_HEADS and 0 < hd <= MAX_HEAD_DIM and 0 < hdv <= MAX_HEAD_DIM for kv, hd, hdv, _ in pools
    ):
        raise EntryError("a layout field is out of range")
    n_kv, hd, hdv, windows = (tuple(int(v) for v in column) for column in zip(*pools, strict=True))
    layout = KVLayout(dtype, n_kv, hd, hdv, windows)
    if basis != layout.basis:
        raise EntryError(f"KV basis {basis} does not match {dtype}")
    try:
        conv_id = cid_raw.decode()
    except UnicodeDecodeError:
        raise EntryError("conv id is not UTF-8") from None
    if header_bytes != _header_bytes(layout, cid_raw, n_tokens):
        raise EntryError(f"header size {header_bytes} does not match its fields")
    expected = header_bytes + layout.body_bytes(n_tokens) + CHECKSUM_BYTES
    if file_bytes != expected:
        raise EntryError(f"size {file_bytes} bytes, its header says {expected}")
    token_ids = np.frombuffer(ids_raw, dtype="<i4").astype(np.int32)
    raw = (fixed + pools_raw + cid_raw + ids_raw).ljust(header_bytes, b"\0")
    return EntryHeader(
        path, fingerprint, layout, conv_id, token_ids, created_ns, last_used_ns, header_bytes, file_bytes, raw
    )


def check_compatible(header: EntryHeader, fingerprint: bytes, layout: KVLayout) -> None:
    if header.fingerprint != fingerprint:
        raise ForeignEntryError("saved by another model (fingerprint differs)")
    if header.layout != layout:
        raise ForeignEntryError(f"KV layout {header.layout} differs from {layout}")


def read_entry(header: EntryHeader, n_tokens: int) -> KVSnapshot:
    """Positions [0, n_tokens) of the entry, after checking the whole file's checksum."""
    if not 0 < n_tokens <= header.n_tokens:
        raise ValueError(f"asked for {n_tokens} of {header.n_tokens} tokens")
    # mapped, not read: the arrays view the page cache and the KV cache copies from there in one pass.
    # Entries are replaced by rename, never rewritten, so the mapping stays whole even if evicted meanwhile.
    # (A read error in a mapped page is SIGBUS, not an exception: the store process dies and the daemon
    # restarts it. Files here are only ever renamed into place, never truncated, so that needs a failing disk.)
    try:
        with open_entry(header.path) as f:
            if os.fstat(f.fileno()).st_size != header.file_bytes:
                raise EntryUnavailable("replaced since its header was read")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise EntryUnavailable(f"unreadable: {e.strerror}") from None
    # the path may now name another file than the header was read from (replaced, or evicted and saved
    # again): serve it only if its own header is the one the caller matched the prompt against
    if buf[: header.header_bytes] != header.raw:
        raise EntryUnavailable("replaced since its header was read")
    body_end = header.file_bytes - CHECKSUM_BYTES
    if checksum(memoryview(buf)[:body_end]) != buf[body_end:]:
        raise EntryError("checksum mismatch: the file is corrupt")
    lay, n = header.layout, header.n_tokens
    dt = np.dtype(NUMPY_DTYPES[lay.dtype]).newbyteorder("<")
    at = header.header_bytes

    def take(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        nonlocal at
        count = int(np.prod(shape))
        a = np.frombuffer(buf, dtype=dtype, count=count, offset=at).reshape(shape)
        at += count * dtype.itemsize
        return a[:n_tokens]

    k, v = [], []
    for n_kv, hd, hdv in map(lay.pool, range(lay.n_layers)):
        k.append(take(dt, (n, n_kv, hd)))
        v.append(take(dt, (n, n_kv, hdv)))
    k_scale = v_scale = None
    if lay.dtype == "int8":
        f4 = np.dtype("<f4")
        k_scale, v_scale = [], []
        for n_kv in lay.n_kv_heads:
            k_scale.append(take(f4, (n, n_kv)))
            v_scale.append(take(f4, (n, n_kv)))
    ids = header.token_ids[:n_tokens].copy()
    return KVSnapshot(lay.dtype, ids, k, v, k_scale, v_scale)  # type: ignore[arg-type]
