"""Every bad model file is a typed `ModelFileError` naming the file and the problem, never a raw
IndexError, ValueError, UnicodeError, MemoryError... The bad files are corrupted copies of a valid tiny
llama model (testkit/tiny_models.py) or files written with small edits to its metadata and tensors."""

from __future__ import annotations

import contextlib
import random
import struct
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from genie_common.errors import ModelFileError
from genie_common.gguf_file import GGUFFile
from genie_workers.engine.backends.numpy_backend import NumpyBackend
from genie_workers.engine.model import Model
from testkit.tiny_models import write_tiny_model

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Tiny:
    path: Path
    data: bytes
    metadata_start: int  # first metadata key (right after the 24-byte header)
    tokens_start: int  # the tokenizer.ggml.tokens entry, the largest metadata value
    info_start: int  # first tensor-info record
    data_start: int  # first tensor's data


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_tiny_model("llama", path)
    reader = gguf.GGUFReader(path)  # an independent parser, to find where each part of the file lies
    info_start = int(reader.tensors[0].field.offset)
    data_start = int(reader.data_offset)
    tokens_start = int(reader.fields["tokenizer.ggml.tokens"].offset)
    del reader
    assert 24 < tokens_start < info_start < data_start < path.stat().st_size
    return Tiny(path, path.read_bytes(), 24, tokens_start, info_start, data_start)


@pytest.fixture
def bad(tmp_path: Path) -> Callable[[bytes], Path]:
    def write(data: bytes, name: str = "bad.gguf") -> Path:
        p = tmp_path / name
        p.write_bytes(data)
        return p

    return write


def expect_model_error(path: Path, *fragments: str, gguf_file: bool = False) -> ModelFileError:
    """Model.load (and GGUFFile when `gguf_file`) raise ModelFileError naming `path` and each fragment."""
    calls: list[Callable[[], Any]] = [lambda: Model.load(path, NumpyBackend())]
    if gguf_file:
        calls.append(lambda: GGUFFile(path).close())
    err = None
    for call in calls:
        with pytest.raises(ModelFileError) as info:
            call()
        err = info.value
        message = str(err)
        assert err.path == str(path)
        assert str(path) in message, message
        assert "\n" not in message, message
        for fragment in fragments:
            assert fragment.lower() in message.lower(), f"{fragment!r} not in {message!r}"
    assert err is not None
    return err


# -- files that are not GGUF at all ---------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    expect_model_error(tmp_path / "nope.gguf", "no such file", gguf_file=True)


def test_directory(tmp_path: Path) -> None:
    d = tmp_path / "dir.gguf"
    d.mkdir()
    expect_model_error(d, "directory", gguf_file=True)


@pytest.mark.parametrize("size", [0, 10])
def test_too_small(bad: Callable[[bytes], Path], tiny: Tiny, size: int) -> None:
    expect_model_error(bad(tiny.data[:size]), "not a GGUF file", f"{size} bytes", gguf_file=True)


def test_bad_magic(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    expect_model_error(bad(b"GGML" + tiny.data[4:]), "not a GGUF file", "magic", gguf_file=True)


def test_not_gguf_text(bad: Callable[[bytes], Path]) -> None:
    expect_model_error(bad(b"<html>this is a download error page, not a model</html>\n" * 4), "magic", gguf_file=True)


def test_unsupported_version(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    data = bytearray(tiny.data)
    struct.pack_into("<I", data, 4, 99)
    expect_model_error(bad(bytes(data)), "version 99", gguf_file=True)


# -- truncation ------------------------------------------------------------------------------------

CUTS = {
    "header": lambda t: 12,
    "header-end": lambda t: 23,
    "first-key": lambda t: t.metadata_start + 6,
    "token-list": lambda t: t.tokens_start + 2000,
    "metadata-end": lambda t: t.info_start - 3,
    "tensor-info": lambda t: t.info_start + 40,
    "tensor-info-end": lambda t: t.data_start - 1,
    "data-start": lambda t: t.data_start + 100,
    "data-half": lambda t: len(t.data) // 2,
    "last-byte": lambda t: len(t.data) - 1,
}


@pytest.mark.parametrize("where", CUTS)
def test_truncated(bad: Callable[[bytes], Path], tiny: Tiny, where: str) -> None:
    cut = CUTS[where](tiny)
    # a file shorter than the header is "not a GGUF file: only N bytes"; anything longer is "truncated"
    expect_model_error(bad(tiny.data[:cut]), "bytes" if cut < 24 else "truncated", gguf_file=True)


# -- hostile lengths and counts --------------------------------------------------------------------


def test_huge_string_length(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    data = bytearray(tiny.data)
    assert struct.unpack_from("<Q", data, 24)[0] == len("general.architecture")  # the first key's length
    struct.pack_into("<Q", data, 24, 0xFFFFFFFFFFFFFFF0)
    expect_model_error(bad(bytes(data)), "corrupt", gguf_file=True)


def test_string_length_past_end(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    data = bytearray(tiny.data)
    struct.pack_into("<Q", data, 24, len(data))  # under the 16 MiB cap, but longer than the file
    expect_model_error(bad(bytes(data)), "truncated", gguf_file=True)


def test_huge_token_count(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    # the tokens entry: key length, key, value type (ARRAY), item type (STRING), count
    off = tiny.tokens_start + 8 + len("tokenizer.ggml.tokens") + 4 + 4
    data = bytearray(tiny.data)
    assert struct.unpack_from("<Q", data, off)[0] == 384
    struct.pack_into("<Q", data, off, 1 << 60)
    expect_model_error(bad(bytes(data)), "truncated", gguf_file=True)


@pytest.mark.parametrize("offset,name", [(8, "tensor"), (16, "metadata")])
@pytest.mark.parametrize("count", [1 << 62, 0xFFFFFFFFFFFFFFFF])
def test_huge_counts(bad: Callable[[bytes], Path], tiny: Tiny, offset: int, name: str, count: int) -> None:
    data = bytearray(tiny.data)
    struct.pack_into("<Q", data, offset, count)
    expect_model_error(bad(bytes(data)), "corrupt header", gguf_file=True)


def test_one_tensor_too_many(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    data = bytearray(tiny.data)
    n = struct.unpack_from("<Q", data, 8)[0]
    struct.pack_into("<Q", data, 8, n + 1)  # the padding and weights are then read as tensor info
    expect_model_error(bad(bytes(data)), gguf_file=True)


def test_tensor_type_unknown(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    # token_embd.weight's record: name length, name, n_dims, 2 dims, type
    off = tiny.info_start + 8 + len("token_embd.weight") + 4 + 2 * 8
    data = bytearray(tiny.data)
    assert struct.unpack_from("<I", data, off)[0] == GGMLQuantizationType.F32
    struct.pack_into("<I", data, off, 200)
    expect_model_error(bad(bytes(data)), "token_embd.weight", "unknown type 200", gguf_file=True)


def test_tensor_dims_corrupt(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    off = tiny.info_start + 8 + len("token_embd.weight")
    data = bytearray(tiny.data)
    struct.pack_into("<I", data, off, 9)
    expect_model_error(bad(bytes(data)), "token_embd.weight", "dimensions", gguf_file=True)


def test_tensor_offset_past_end(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    off = tiny.info_start + 8 + len("token_embd.weight") + 4 + 2 * 8 + 4
    data = bytearray(tiny.data)
    struct.pack_into("<Q", data, off, 1 << 62)
    expect_model_error(bad(bytes(data)), "token_embd.weight", "truncated", gguf_file=True)


def _nested_arrays(depth: int) -> bytes:
    """A GGUF whose one metadata value is an array of an array of ... `depth` deep."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"x" + struct.pack("<I", 9)
    return out + struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)


def test_deeply_nested_arrays(bad: Callable[[bytes], Path]) -> None:
    expect_model_error(bad(_nested_arrays(100_000)), gguf_file=True)


def test_nested_arrays_shallow_ok(bad: Callable[[bytes], Path]) -> None:
    with GGUFFile(bad(_nested_arrays(3))) as gf:
        assert "x" in gf.metadata


# -- well-formed GGUF files with the wrong contents -------------------------------------------------


@contextlib.contextmanager
def _editing_writer(edit: Callable[[gguf.GGUFWriter], None]) -> Iterator[None]:
    """While active, write_tiny_model's GGUFWriter calls `edit(writer)` just before writing the header,
    when writer.kv_data[0] and writer.tensors[0] hold every key and tensor."""
    original = gguf.GGUFWriter

    class EditingWriter(original):  # type: ignore[misc, valid-type]
        def write_header_to_file(self, *args: Any, **kwargs: Any) -> None:
            edit(self)
            super().write_header_to_file(*args, **kwargs)

    gguf.GGUFWriter = EditingWriter  # type: ignore[misc]
    try:
        yield
    finally:
        gguf.GGUFWriter = original  # type: ignore[misc]


def write_edited(path: Path, *edits: Callable[[gguf.GGUFWriter], None], arch: str = "llama") -> Path:
    def edit(w: gguf.GGUFWriter) -> None:
        for e in edits:
            e(w)

    with _editing_writer(edit):
        write_tiny_model(arch, path)
    return path


def set_kv(key: str, value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None):  # type: ignore[no-untyped-def]
    def edit(w: gguf.GGUFWriter) -> None:
        w.kv_data[0][key] = gguf.GGUFValue(value, vtype, sub_type)

    return edit


def del_kv(key: str):  # type: ignore[no-untyped-def]
    def edit(w: gguf.GGUFWriter) -> None:
        del w.kv_data[0][key]

    return edit


def del_tensor(name: str):  # type: ignore[no-untyped-def]
    def edit(w: gguf.GGUFWriter) -> None:
        del w.tensors[0][name]

    return edit


def test_edited_baseline_loads(tmp_path: Path) -> None:
    """The editing writer itself leaves a loadable model."""
    m = Model.load(write_edited(tmp_path / "m.gguf"), NumpyBackend())
    assert m.config.arch == "llama" and m.config.n_layers == 2


def test_unknown_architecture(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect_model_error(path, "unknown architecture", "mamba")


def test_unknown_architecture_in_tiny_model(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", set_kv("general.architecture", "mamba", GGUFValueType.STRING))
    expect_model_error(path, "unknown architecture 'mamba'")


def test_no_architecture(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", del_kv("general.architecture"))
    expect_model_error(path, "general.architecture")


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    def add_q2k(w: gguf.GGUFWriter) -> None:
        # one row of 256 Q2_K weights (84 bytes), given as raw block bytes
        w.add_tensor("blk.0.extra.weight", np.zeros((1, 84), np.uint8), raw_dtype=GGMLQuantizationType.Q2_K)

    path = write_edited(tmp_path / "m.gguf", add_q2k)
    expect_model_error(path, "blk.0.extra.weight", "unsupported type Q2_K", gguf_file=True)


def test_missing_tensor(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", del_tensor("blk.1.ffn_up.weight"))
    expect_model_error(path, "missing tensor blk.1.ffn_up.weight")


def test_missing_output_norm(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", del_tensor("output_norm.weight"))
    expect_model_error(path, "output_norm.weight")


def test_wrong_tensor_shape(tmp_path: Path) -> None:
    def shrink(w: gguf.GGUFWriter) -> None:
        del w.tensors[0]["blk.0.attn_q.weight"]
        w.add_tensor("blk.0.attn_q.weight", np.zeros((32, 64), np.float32))

    path = write_edited(tmp_path / "m.gguf", shrink)
    expect_model_error(path, "blk.0.attn_q.weight", "shape")


def test_shape_does_not_fit_blocks(tmp_path: Path) -> None:
    def odd_q8_0(w: gguf.GGUFWriter) -> None:
        # one Q8_0 block (34 bytes) whose recorded row length, 48, is not a multiple of the 32-wide block
        w.add_tensor("blk.0.odd.weight", np.zeros((1, 34), np.uint8), raw_dtype=GGMLQuantizationType.Q8_0)
        w.tensors[0]["blk.0.odd.weight"].shape = (1, 48)

    path = write_edited(tmp_path / "m.gguf", odd_q8_0)
    expect_model_error(path, "blk.0.odd.weight", "Q8_0 blocks", gguf_file=True)


@pytest.mark.parametrize("bos", [384, 10**6])
def test_bos_out_of_range(tmp_path: Path, bos: int) -> None:
    path = write_edited(tmp_path / "m.gguf", set_kv("tokenizer.ggml.bos_token_id", bos, GGUFValueType.UINT32))
    expect_model_error(path, "tokenizer.ggml.bos_token_id", str(bos), "vocabulary")


def test_eos_out_of_range(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", set_kv("tokenizer.ggml.eos_token_id", 9999, GGUFValueType.UINT32))
    expect_model_error(path, "tokenizer.ggml.eos_token_id")


def test_gpt2_without_merges(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", set_kv("tokenizer.ggml.model", "gpt2", GGUFValueType.STRING))
    expect_model_error(path, "gpt2", "merges")


def test_unknown_tokenizer_model(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", set_kv("tokenizer.ggml.model", "rwkv", GGUFValueType.STRING))
    expect_model_error(path, "tokenizer", "rwkv")


def test_no_token_list(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", del_kv("tokenizer.ggml.tokens"))
    expect_model_error(path, "tokenizer.ggml.tokens")


def test_token_arrays_disagree(tmp_path: Path) -> None:
    path = write_edited(
        tmp_path / "m.gguf", set_kv("tokenizer.ggml.scores", [0.0] * 10, GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
    )
    expect_model_error(path, "scores")


def test_missing_hyper_parameter(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", del_kv("llama.embedding_length"))
    expect_model_error(path, "llama.embedding_length")


def test_heads_do_not_divide(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", set_kv("llama.attention.head_count_kv", 3, GGUFValueType.UINT32))
    expect_model_error(path, "KV heads")


_U32, _F32, _STR, _ARR = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING, GGUFValueType.ARRAY

# (key, value, type, sub_type): a well-typed file with a wrong-typed or wrong value
WRONG_VALUES = {
    "heads-2308": ("llama.attention.head_count", 2308, _U32, None),
    "key_length-0": ("llama.attention.key_length", 0, _U32, None),
    "embedding-str": ("llama.embedding_length", "abc", _STR, None),
    "embedding-nan": ("llama.embedding_length", float("nan"), _F32, None),
    "embedding-str-array": ("llama.embedding_length", ["a"], _ARR, _STR),
    "eps-str": ("llama.attention.layer_norm_rms_epsilon", "abc", _STR, None),
    "eps-inf": ("llama.attention.layer_norm_rms_epsilon", float("inf"), _F32, None),
    "ffn-0": ("llama.feed_forward_length", 0, _U32, None),
    "rope-scaling-yarn": ("llama.rope.scaling.type", "yarn", _STR, None),
    "architecture-int": ("general.architecture", 5, _U32, None),
    "tokenizer-model-array": ("tokenizer.ggml.model", ["llama"], _ARR, _STR),
    "tokens-ints": ("tokenizer.ggml.tokens", list(range(384)), _ARR, _U32),
    "alignment-0": ("general.alignment", 0, _U32, None),
    "alignment-3": ("general.alignment", 3, _U32, None),
    "alignment-64": ("general.alignment", 64, _U32, None),  # the writer padded to 32
    "alignment-str": ("general.alignment", "abc", _STR, None),
    "alignment-array": ("general.alignment", [32], _ARR, _U32),
    "bos-str": ("tokenizer.ggml.bos_token_id", "abc", _STR, None),
    "bos-nan": ("tokenizer.ggml.bos_token_id", float("nan"), _F32, None),
    "bos-array": ("tokenizer.ggml.bos_token_id", [1, 2], _ARR, _U32),
    "add_bos-array": ("tokenizer.ggml.add_bos_token", [True, False], _ARR, GGUFValueType.BOOL),
    "scores-str": ("tokenizer.ggml.scores", ["x"] * 384, _ARR, _STR),
    "token_type-str": ("tokenizer.ggml.token_type", ["x"] * 384, _ARR, _STR),
}


@pytest.mark.parametrize("case", WRONG_VALUES)
def test_wrong_metadata_value(tmp_path: Path, case: str) -> None:
    key, value, vtype, sub_type = WRONG_VALUES[case]
    path = write_edited(tmp_path / "m.gguf", set_kv(key, value, vtype, sub_type))
    expect_model_error(path)


def test_huge_block_count_fails_fast(tmp_path: Path) -> None:
    path = write_edited(tmp_path / "m.gguf", set_kv("llama.block_count", 0xFFFFFFFF, GGUFValueType.UINT32))
    code = textwrap.dedent(
        f"""
        from genie_workers.engine.backends.numpy_backend import NumpyBackend
        from genie_common.errors import ModelFileError
        from genie_workers.engine.model import Model
        try:
            Model.load({str(path)!r}, NumpyBackend())
        except ModelFileError as e:
            print("ModelFileError", e)
        """
    )
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=4)
    except subprocess.TimeoutExpired:
        pytest.fail("Model.load did not finish within 4 s")
    assert r.returncode == 0 and r.stdout.startswith("ModelFileError"), r.stdout + r.stderr


def test_f32_data_relabelled_q8_0(bad: Callable[[bytes], Path], tiny: Tiny) -> None:
    # token_embd.weight's type field F32 -> Q8_0: the size still fits, the block scales are garbage
    off = tiny.info_start + 8 + len("token_embd.weight") + 4 + 2 * 8
    data = bytearray(tiny.data)
    struct.pack_into("<I", data, off, GGMLQuantizationType.Q8_0)
    path = bad(bytes(data))
    with warnings.catch_warnings(), contextlib.suppress(ModelFileError):
        warnings.simplefilter("error")  # loading or a typed error are both fine; a warning is not
        Model.load(path, NumpyBackend())


# -- fuzz -------------------------------------------------------------------------------------------

N_FUZZ = 200


def _mutations(tiny: Tiny, n: int) -> Iterator[tuple[str, bytes]]:
    """n seeded corruptions: 3/4 single-byte flips (mostly in the header, metadata and tensor infos,
    where a flip changes structure), 1/4 truncations anywhere."""
    rng = random.Random(20240601)
    for i in range(n):
        if i % 4 == 3:
            cut = rng.randrange(len(tiny.data))
            yield f"truncate at {cut}", tiny.data[:cut]
        else:
            off = rng.randrange(tiny.data_start) if rng.random() < 0.85 else rng.randrange(len(tiny.data))
            data = bytearray(tiny.data)
            data[off] ^= rng.randrange(1, 256)
            yield f"byte {off}: {tiny.data[off]:#04x} -> {data[off]:#04x}", bytes(data)


def test_fuzz_flips_and_truncations(tmp_path: Path, tiny: Tiny) -> None:
    failures, outcomes = [], {"loaded": 0, "ModelFileError": 0}
    for i, (desc, data) in enumerate(_mutations(tiny, N_FUZZ)):
        path = tmp_path / f"fuzz-{i}.gguf"  # a fresh file: never rewrite one that may still be mapped
        path.write_bytes(data)
        for what, load in (
            ("GGUFFile", lambda p=path: GGUFFile(p).close()),
            ("Model.load", lambda p=path: Model.load(p, NumpyBackend())),
        ):
            try:
                load()
                outcome = "loaded"
            except ModelFileError as e:
                outcome = "ModelFileError"
                if str(path) not in str(e):
                    failures.append(f"{desc}: {what}: message does not name the file: {e}")
            except Exception as e:  # anything else is the bug this test looks for
                tb = e.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                where = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb else "?"
                failures.append(f"{desc}: {what}: {type(e).__name__} at {where}: {e}")
                continue
            if what == "Model.load":
                outcomes[outcome] += 1
        path.unlink()
    assert not failures, "\n".join(failures)
    # the corpus exercises both outcomes
    assert outcomes["loaded"] > 10 and outcomes["ModelFileError"] > 50, outcomes
