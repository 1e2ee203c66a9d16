"""llama.cpp's vocab-only GGUFs in testkit/fixtures/vocab/, some committed xz-compressed.

`vocab_gguf(name)` is the path of ggml-vocab-<name>.gguf, unpacked once per machine from its `.xz` into the
temp directory (named by a hash of the compressed bytes, written to a temporary name and renamed, so
parallel runs and a changed fixture never read a half-written or stale file).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import tempfile
from pathlib import Path

VOCAB_DIR = Path(__file__).resolve().parent / "fixtures" / "vocab"


def vocab_gguf(name: str) -> Path:
    plain = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if plain.exists():
        return plain
    packed = plain.with_name(plain.name + ".xz")
    data = packed.read_bytes()
    cache = Path(tempfile.gettempdir()) / "genie-test-vocab"
    cache.mkdir(exist_ok=True)
    out = cache / f"{plain.stem}-{hashlib.sha256(data).hexdigest()[:16]}.gguf"
    if not out.exists():
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lzma.decompress(data))
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return out


def vector_file(name: str) -> Path:
    """The `.inp` file of llama.cpp's test vectors for the vocab (with `.out` beside it)."""
    return VOCAB_DIR / f"ggml-vocab-{name}.gguf.inp"
