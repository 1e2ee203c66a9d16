"""Synthetic GGUF models with the exact tensor shapes and Q4_K_M type mix of real ones, random weights.

Timing does not depend on weight values, so these stand in for Qwen3-0.6B and Qwen3-4B on speed
(../shared/ANCHORS.md measured llama.cpp on files of the same shapes), and for Gemma 4 E2B (shapes of
bench/NOTES-gemma4.md §1.1: 35 layers, sliding head dim 256 and global 512, the last 20 layers sharing K/V with
double-width FFNs, per-layer embeddings of 256; no llama.cpp numbers for it yet). Block data is valid:
random quants with small positive float16 scales. The vocabulary is a dummy SentencePiece one of the
right size.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testkit.tiny_models import add_gemma4_keys  # noqa: E402  (the converter's Gemma 4 keys, shared with tests)

Q = GGMLQuantizationType
SCALE_FIELDS = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}  # byte offsets of each block's float16 scales


@dataclass(frozen=True)
class Shape:
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    n_vocab: int = 151_936
    n_ctx: int = 40_960
    rope_base: float = 1_000_000.0


@dataclass(frozen=True)
class Gemma4Shape:
    name: str
    n_layers: int = 35
    d_model: int = 1536
    n_heads: int = 8
    n_kv_heads: int = 1
    head_dim: int = 256  # sliding layers
    global_head_dim: int = 512
    ffn_dim: int = 6144  # twice that in the shared layers
    n_shared: int = 20
    ple_dim: int = 256
    sliding_window: int = 512
    n_vocab: int = 262_144
    n_ctx: int = 32_768

    def sliding(self) -> list[bool]:
        return [(i + 1) % 5 != 0 for i in range(self.n_layers)]  # every fifth layer global


SHAPES: dict[str, Shape | Gemma4Shape] = {
    "qwen3-0.6b": Shape("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072),
    "qwen3-4b": Shape("qwen3-4b", 36, 2560, 32, 8, 128, 9728),
    "gemma4-e2b": Gemma4Shape("gemma4-e2b"),
}


def more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for attn_v and ffn_down: Q6_K on the first and last eighth and every
    third layer between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block_elems
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        raw[:, off : off + 2] = rng.uniform(0.0005, 0.004, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


# a plain chat template, so that the daemon serves `/api/chat` on these files (bench/daemon_streams.py)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _add_dummy_vocab(w: GGUFWriter, n_vocab: int) -> None:
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(n_vocab - len(tokens))]
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)


def _finish(w: GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def synthetic_file(name: str, out_dir: Path) -> Path:
    """out_dir/NAME-q4_k_m.gguf for the shape `name`, written first if it is not there yet."""
    path = out_dir / f"{name}-q4_k_m.gguf"
    if not path.exists():
        t0 = time.perf_counter()
        out_dir.mkdir(parents=True, exist_ok=True)
        write_synthetic(SHAPES[name], path)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def write_synthetic(shape: Shape | Gemma4Shape, path: Path, seed: int = 0) -> Path:
    if isinstance(shape, Gemma4Shape):
        return write_synthetic_gemma4(shape, path, seed)
    rng = np.random.default_rng(seed)
    s = shape
    w = GGUFWriter(str(path), "qwen3")
    w.add_name(f"synthetic {s.name} Q4_K_M")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.d_model)
    w.add_block_count(s.n_layers)
    w.add_feed_forward_length(s.ffn_dim)
    w.add_head_count(s.n_heads)
    w.add_head_count_kv(s.n_kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    _add_dummy_vocab(w, s.n_vocab)

    def quant(name: str, qtype: Q, rows: int, cols: int) -> None:
        w.add_tensor(name, _blocks(qtype, rows, cols, rng), raw_dtype=qtype)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    quant("token_embd.weight", Q.Q6_K, s.n_vocab, s.d_model)  # tied output: llama.cpp keeps it Q6_K
    norm("output_norm.weight", s.d_model)
    for i in range(s.n_layers):
        big = Q.Q6_K if more_bits(i, s.n_layers) else Q.Q4_K
        norm(f"blk.{i}.attn_norm.weight", s.d_model)
        norm(f"blk.{i}.ffn_norm.weight", s.d_model)
        norm(f"blk.{i}.attn_q_norm.weight", s.head_dim)
        norm(f"blk.{i}.attn_k_norm.weight", s.head_dim)
        quant(f"blk.{i}.attn_q.weight", Q.Q4_K, s.n_heads * s.head_dim, s.d_model)
        quant(f"blk.{i}.attn_k.weight", Q.Q4_K, s.n_kv_heads * s.head_dim, s.d_model)
        quant(f"blk.{i}.attn_v.weight", big, s.n_kv_heads * s.head_dim, s.d_model)
        quant(f"blk.{i}.attn_output.weight", Q.Q4_K, s.d_model, s.n_heads * s.head_dim)
        quant(f"blk.{i}.ffn_gate.weight", Q.Q4_K, s.ffn_dim, s.d_model)
        quant(f"blk.{i}.ffn_up.weight", Q.Q4_K, s.ffn_dim, s.d_model)
        quant(f"blk.{i}.ffn_down.weight", big, s.d_model, s.ffn_dim)
    return _finish(w, path)


def write_synthetic_gemma4(s: Gemma4Shape, path: Path, seed: int = 0) -> Path:
    """Gemma 4 E2B's shapes in the Q4_K_M mix of the others (token and per-layer embeddings: Q6_K and
    Q4_K, an assumption: no real E2B Q4_K_M file was at hand to copy its types)."""
    rng = np.random.default_rng(seed)
    L, d, H, P = s.n_layers, s.d_model, s.n_heads, s.ple_dim
    sliding = s.sliding()
    hp = dict(
        context_length=s.n_ctx, d_model=d, n_layers=L, ffn_dim=s.ffn_dim, n_shared=s.n_shared, n_heads=H,
        n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, global_head_dim=s.global_head_dim, rope_base=1_000_000.0,
        rope_base_swa=10_000.0, sliding_window=s.sliding_window, sliding=sliding, ple_dim=P, rms_eps=1e-6,
        softcap=30.0,
    )  # fmt: skip
    w = GGUFWriter(str(path), "gemma4")
    w.add_name(f"synthetic {s.name} Q4_K_M")
    add_gemma4_keys(w, hp)
    _add_dummy_vocab(w, s.n_vocab)

    def quant(name: str, qtype: Q, rows: int, cols: int) -> None:
        w.add_tensor(name, _blocks(qtype, rows, cols, rng), raw_dtype=qtype)

    def f32(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, values.astype(np.float32))

    def norm(name: str, n: int) -> None:
        f32(name, 1.0 + 0.1 * rng.standard_normal(n))

    quant("token_embd.weight", Q.Q6_K, s.n_vocab, d)  # tied output
    quant("per_layer_token_embd.weight", Q.Q4_K, s.n_vocab, L * P)
    quant("per_layer_model_proj.weight", Q.Q4_K, L * P, d)
    norm("per_layer_proj_norm.weight", P)
    rotated = s.global_head_dim // 8  # proportional RoPE: a quarter of the global head's pairs rotate
    f32("rope_freqs.weight", np.array([1.0] * rotated + [1e30] * (s.global_head_dim // 2 - rotated)))
    norm("output_norm.weight", d)
    for i in range(L):
        p, hd = f"blk.{i}.", s.head_dim if sliding[i] else s.global_head_dim
        own_kv = i < L - s.n_shared
        ffn = s.ffn_dim * (1 if own_kv else 2)
        big = Q.Q6_K if more_bits(i, L) else Q.Q4_K
        for role in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
            norm(p + role + ".weight", d)
        norm(p + "attn_q_norm.weight", hd)
        quant(p + "attn_q.weight", Q.Q4_K, H * hd, d)
        if own_kv:
            norm(p + "attn_k_norm.weight", hd)
            quant(p + "attn_k.weight", Q.Q4_K, s.n_kv_heads * hd, d)
            quant(p + "attn_v.weight", big, s.n_kv_heads * hd, d)
        quant(p + "attn_output.weight", Q.Q4_K, d, H * hd)
        quant(p + "ffn_gate.weight", Q.Q4_K, ffn, d)
        quant(p + "ffn_up.weight", Q.Q4_K, ffn, d)
        quant(p + "ffn_down.weight", big, d, ffn)
        quant(p + "inp_gate.weight", Q.Q4_K, P, d)
        quant(p + "proj.weight", Q.Q4_K, d, P)
        f32(p + "layer_output_scale.weight", np.array([0.5]))
    return _finish(w, path)
