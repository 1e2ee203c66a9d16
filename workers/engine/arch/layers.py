"""The shared decoder forward pass. Every architecture is this pass with the roles it has:
optional biases, q/k norms and post-norms switch themselves on when the weights exist.

Shapes: n tokens, d = d_model, H / Hkv query / KV heads, hd / hdv head dims.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Array, Backend, Weight
from ..kv_cache import KVCache
from ..model_config import ModelConfig


@dataclass
class LayerWeights:
    attn_norm: Array
    qkv: Weight  # group of wq, wk, wv
    wo: Weight
    ffn_norm: Array
    gate_up: Weight  # group of w_gate, w_up
    w_down: Weight
    # bqkv: the three biases as one vector; qk_norm: [H + Hkv, hd] q_norm rows then k_norm rows;
    # post_attn_norm, post_ffn_norm
    optional: dict[str, Array] = field(default_factory=dict)


@dataclass
class ModelWeights:
    embed: Weight
    output_norm: Array
    output: Weight  # the embedding again when tied
    layers: list[LayerWeights]


def forward(
    cfg: ModelConfig,
    weights: ModelWeights,
    backend: Backend,
    kv: KVCache,
    slot: int,
    ids: np.ndarray,
    pos0: int,
    logit_rows: slice | None,
) -> Array | None:
    """Run tokens `ids` [n] at positions pos0.. of `slot`, writing their K/V.

    Returns logits [rows, vocab] for `ids[logit_rows]` (None: no logits, e.g. a prefill chunk that
    is not the last)."""
    b = backend
    positions = np.arange(pos0, pos0 + len(ids))
    x = b.embed(weights.embed, b.stage_inputs(ids, pos0), cfg.embed_scale)  # [n, d]
    pending = None  # the previous layer's FFN output, added to x together with this layer's input norm
    for i, (lw, lc) in enumerate(zip(weights.layers, cfg.layers, strict=True)):
        opt = lw.optional
        x, qkv = b.add_norm_matmul(x, pending, lw.attn_norm, cfg.rms_eps, lw.qkv)  # [n, (H + Hkv) * hd + Hkv * hdv]
        if "bqkv" in opt:
            qkv += opt["bqkv"]
        q = b.prepare_qkv(qkv, cfg, lc, opt.get("qk_norm"), positions, kv.layers[i], slot, pos0)
        attn = b.attention(q, kv.layers[i], slot, pos0, lc.sliding_window, cfg.attn_scale, cfg.attn_logit_softcap)
        o = b.matmul(attn, lw.wo)
        if "post_attn_norm" in opt:
            o = b.rms_norm(o, opt["post_attn_norm"], cfg.rms_eps)
        x, gate_up = b.add_norm_matmul(x, o, lw.ffn_norm, cfg.rms_eps, lw.gate_up)  # [n, 2 * ffn]
        pending = b.gated_matmul(gate_up, cfg.activation, lw.w_down)
        if "post_ffn_norm" in opt:
            pending = b.rms_norm(pending, opt["post_ffn_norm"], cfg.rms_eps)
    x = x + pending
    if logit_rows is None:
        return None
    h = b.rms_norm(x[logit_rows], weights.output_norm, cfg.rms_eps)
    logits = b.matmul(h, weights.output)
    if cfg.final_logit_softcap:
        logits = b.softcap(logits, cfg.final_logit_softcap)
    return logits


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Numpy-order shape of each role; a file that disagrees is rejected before any compute."""
    d, hd, hdv = cfg.d_model, cfg.head_dim, cfg.v_head_dim
    return {
        "attn_norm": (d,),
        "wq": (cfg.n_heads * hd, d),
        "wk": (cfg.n_kv_heads * hd, d),
        "wv": (cfg.n_kv_heads * hdv, d),
        "wo": (d, cfg.n_heads * hdv),
        "bq": (cfg.n_heads * hd,),
        "bk": (cfg.n_kv_heads * hd,),
        "bv": (cfg.n_kv_heads * hdv,),
        "q_norm": (hd,),
        "k_norm": (hd,),
        "post_attn_norm": (d,),
        "ffn_norm": (d,),
        "w_gate": (cfg.ffn_dim, d),
        "w_up": (cfg.ffn_dim, d),
        "w_down": (d, cfg.ffn_dim),
        "post_ffn_norm": (d,),
        "embed": (cfg.n_vocab, d),
        "output": (cfg.n_vocab, d),
        "output_norm": (d,),
    }
