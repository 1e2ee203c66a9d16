"""A fast GGUF reader: header and metadata parsed with `struct`, tensor data left memory-mapped.

`gguf.GGUFReader` builds Python objects for every field and takes ~10 s on Gemma's 262 144-string
vocabulary; this reader decodes string arrays in one pass and numeric arrays with `np.frombuffer`,
and opens Gemma 3 270M in ~0.2 s. Every length and offset is checked against the file size, so a
truncated or hostile file is a `ModelFileError`, never an IndexError or a huge allocation.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_STRING_BYTES = 1 << 24  # no legitimate key or token is 16 MiB long
MAX_DIMS = 4
MAX_ARRAY_NESTING = 8  # GGUF writers nest arrays at most once; deeper is a hostile file

# Tensor types the engine can compute with (dequantized on the CPU, kept in block layout on the GPU).
SUPPORTED_TENSOR_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
)

# GGUF metadata value types -> (struct format, numpy dtype) for the fixed-size ones.
_SCALAR_TYPES: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "<u1"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_TYPE_STRING = 8
_TYPE_ARRAY = 9


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: `shape` is numpy order (outermost first), `data` a read-only view."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    n_bytes: int
    data: np.ndarray  # uint8 view of the raw block data

    def release_bytes(self, lo: int, hi: int) -> None:
        """Drops the whole pages of bytes [lo, hi) of `data` from this process's resident set when they are a
        read-only mapping of the file (GGUFFile's): a backend copying a large tensor a chunk at a time holds a
        chunk of the file beside its copy, not the whole tensor (Gemma 3's 178 MB output head). Data read again
        comes back from the page cache; anything else (an array of its own) is left as it is."""
        view = self.data.base
        source = view.obj if isinstance(view, memoryview) else None
        if not isinstance(source, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        start = -(-(self.offset + lo) // page) * page
        end = (self.offset + min(hi, self.n_bytes)) // page * page
        if end > start:
            source.madvise(mmap.MADV_DONTNEED, start, end - start)


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; every overrun names the file."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelFileError(self.path, f"truncated file: {what} runs past the end (offset {self.pos})")

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        if n > MAX_STRING_BYTES:
            raise ModelFileError(self.path, f"corrupt file: {what} claims {n} bytes")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR_TYPES:
            return self.scalar(_SCALAR_TYPES[vtype][0], what)
        if vtype == _TYPE_STRING:
            return self.string(what)
        if vtype == _TYPE_ARRAY:
            return self.array(what, depth=1)
        raise ModelFileError(self.path, f"corrupt file: {what} has unknown value type {vtype}")

    def array(self, what: str, depth: int) -> Any:
        if depth > MAX_ARRAY_NESTING:
            raise ModelFileError(self.path, f"corrupt file: {what} nests arrays deeper than {MAX_ARRAY_NESTING}")
        item_type = self.scalar("<I", what)
        count = self.scalar("<Q", what)
        if item_type in _SCALAR_TYPES:
            dtype = np.dtype(_SCALAR_TYPES[item_type][1])
            self.need(count * dtype.itemsize, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            return arr.astype(bool) if item_type == 7 else arr
        if item_type == _TYPE_STRING:
            self.need(count * 8, what)  # each string has at least its length field
            return self._string_array(count, what)
        if item_type == _TYPE_ARRAY:
            self.need(count * 12, what)
            return [self.array(what, depth + 1) for _ in range(count)]
        raise ModelFileError(self.path, f"corrupt file: {what} is an array of unknown type {item_type}")

    def _string_array(self, count: int, what: str) -> list[str]:
        buf, pos, end = self.buf, self.pos, len(self.buf)
        out: list[str] = []
        append = out.append
        from_bytes = int.from_bytes
        for _ in range(count):
            if pos + 8 > end:
                raise ModelFileError(self.path, f"truncated file: {what} runs past the end")
            n = from_bytes(buf[pos : pos + 8], "little")
            pos += 8
            if n > MAX_STRING_BYTES or pos + n > end:
                raise ModelFileError(self.path, f"truncated or corrupt file: a string of {what} ({n} bytes)")
            append(str(buf[pos : pos + n], "utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out


class GGUFFile:
    """An open GGUF file: `metadata` (key -> value), `tensors` (name -> TensorInfo), memory-mapped data.

    Use as a context manager or call `close()`; tensor views stay valid while the file is open.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._fh = open(self.path, "rb")
        except FileNotFoundError:
            raise ModelFileError(self.path, "no such file") from None
        except IsADirectoryError:
            raise ModelFileError(self.path, "is a directory, not a GGUF file") from None
        except OSError as e:
            raise ModelFileError(self.path, f"cannot open: {e.strerror}") from None
        try:
            self.file_size = self.path.stat().st_size
            if self.file_size < 24:
                raise ModelFileError(self.path, f"not a GGUF file: only {self.file_size} bytes")
            self._mmap = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._buf = memoryview(self._mmap)
            self.metadata: dict[str, Any] = {}
            self.tensors: dict[str, TensorInfo] = {}
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        cur = _Cursor(self._buf, self.path)
        magic = bytes(self._buf[:4])
        if magic != GGUF_MAGIC:
            raise ModelFileError(self.path, f"not a GGUF file: bad magic {magic!r}")
        cur.pos = 4
        self.version = cur.scalar("<I", "version")
        if self.version not in SUPPORTED_VERSIONS:
            raise ModelFileError(self.path, f"unsupported GGUF version {self.version}")
        n_tensors = cur.scalar("<Q", "tensor count")
        n_kv = cur.scalar("<Q", "metadata count")
        # every entry needs more than 8 bytes: a count larger than the file can hold is corruption
        if n_tensors > self.file_size // 8 or n_kv > self.file_size // 8:
            raise ModelFileError(self.path, f"corrupt header: {n_tensors} tensors, {n_kv} metadata keys")
        for _ in range(n_kv):
            key = cur.string("metadata key")
            vtype = cur.scalar("<I", f"type of {key}")
            self.metadata[key] = cur.value(vtype, key)
        infos = []
        for _ in range(n_tensors):
            name = cur.string("tensor name")
            n_dims = cur.scalar("<I", f"dims of {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelFileError(self.path, f"corrupt tensor {name}: {n_dims} dimensions")
            dims = [cur.scalar("<Q", f"shape of {name}") for _ in range(n_dims)]
            raw_type = cur.scalar("<I", f"type of {name}")
            offset = cur.scalar("<Q", f"offset of {name}")
            infos.append((name, dims, raw_type, offset))
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            not isinstance(alignment, int)
            or isinstance(alignment, bool)
            or alignment <= 0
            or alignment & (alignment - 1)
        ):
            raise ModelFileError(self.path, f"corrupt header: alignment {alignment}")
        data_start = (cur.pos + alignment - 1) // alignment * alignment
        self.data_start = data_start
        for name, dims, raw_type, offset in infos:
            self.tensors[name] = self._tensor(name, dims, raw_type, data_start + offset)

    def fingerprint(self) -> bytes:
        """sha256 of the file size, the header and the tensor table: another model or quantization never
        shares it (the KV store keys saved KV by it)."""
        h = hashlib.sha256(self.file_size.to_bytes(8, "little"))
        h.update(self._buf[: self.data_start])
        return h.digest()

    def _tensor(self, name: str, dims: list[int], raw_type: int, start: int) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise ModelFileError(self.path, f"tensor {name} has unknown type {raw_type}") from None
        if qtype not in SUPPORTED_TENSOR_TYPES:
            raise ModelFileError(self.path, f"tensor {name} has unsupported type {qtype.name}")
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        if dims[0] % block_elems or any(d <= 0 for d in dims):
            raise ModelFileError(self.path, f"tensor {name}: shape {dims} does not fit {qtype.name} blocks")
        n_elements = int(np.prod(dims, dtype=object))
        n_bytes = n_elements // block_elems * block_bytes
        if start + n_bytes > self.file_size:
            raise ModelFileError(
                self.path,
                f"truncated file: tensor {name} needs bytes up to {start + n_bytes}, file has {self.file_size}",
            )
        data = np.frombuffer(self._buf, dtype=np.uint8, count=n_bytes, offset=start)
        return TensorInfo(name, tuple(reversed(dims)), qtype, start, n_bytes, data)

    def release(self, tensor: TensorInfo) -> None:
        """Drops the pages of `tensor` from this process's resident set once a backend has copied it (the file
        stays in the page cache; a view still held reads it back from there): a load holds at most a tensor of
        the file at a time beside what the backend made of it, not the whole file (on a Jetson host and GPU
        share the DRAM)."""
        if self._mmap is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        start = tensor.offset // page * page
        end = min(self.file_size, -(-(tensor.offset + tensor.n_bytes) // page) * page)
        self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFileError(self.path, "metadata has no general.architecture")
        return arch

    def close(self) -> None:
        self.tensors = {}
        try:
            if getattr(self, "_buf", None) is not None:
                self._buf.release()
            if getattr(self, "_mmap", None) is not None:
                self._mmap.close()
        except BufferError:
            pass  # a caller still holds a tensor view: the mapping goes when the last view is collected
        self._buf = None  # type: ignore[assignment]
        self._mmap = None  # type: ignore[assignment]
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
