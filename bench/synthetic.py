"""Synthetic GGUF models with the exact tensor shapes and Q4_K_M type mix of real ones, random weights.

Timing does not depend on weight values, so these stand in for Qwen3-0.6B and Qwen3-4B on speed
(../shared/ANCHORS.md measured llama.cpp on files of the same shapes). Block data is valid: random
quants with small positive float16 scales. The vocabulary is a dummy SentencePiece one of the right size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

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


SHAPES = {
    "qwen3-0.6b": Shape("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072),
    "qwen3-4b": Shape("qwen3-4b", 36, 2560, 32, 8, 128, 9728),
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


def write_synthetic(shape: Shape, path: Path, seed: int = 0) -> Path:
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
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(s.n_vocab - len(tokens))]
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * s.n_vocab)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (s.n_vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
