"""The shared decoder forward pass. Every architecture is this pass with the roles it has:
optional biases, q/k norms, post-norms, per-layer embeddings and a layer scale switch themselves on when
the weights exist; K/V sharing, per-layer shapes and RoPE come from the layers' configs.

Shapes: n tokens, d = d_model, H / Hkv query / KV heads, hd / hdv head dims (per layer), P = ple_dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Array, Backend, NextInput, Weight
from ..batch import Batch, Segment
from ..kv_cache import KVCache
from ..model_config import LayerConfig, ModelConfig


class Interrupted(Exception):
    """A forward pass stopped between layers because its caller asked (a cancelled request)."""


@dataclass(frozen=True, eq=False)
class Pending:
    """A product's output y on its way into the stream: x + y, or x + rms_norm(y) * norm (a post-norm), times
    `scale` when there is one (Gemma 4's layer scale). The next product takes it with its own input."""

    y: Array
    norm: Array | None = None
    scale: Array | None = None


def _add_matmul(
    cfg: ModelConfig,
    b: Backend,
    x: Array,
    p: Pending | None,
    norm: Array | None,
    w: Weight,
    then: NextInput | None = None,
) -> tuple[Array, Array]:
    """x after `p`, and its product with w (rms-normed by `norm` first when given) -> (x, product)."""
    if p is not None and (p.norm is not None or p.scale is not None):
        return b.add_normed_matmul(x, p.y, p.norm, cfg.rms_eps, p.scale, norm, w, then)
    if norm is None:
        x = x if p is None else x + p.y
        return x, b.matmul(x, w, then)
    return b.add_norm_matmul(x, None if p is None else p.y, norm, cfg.rms_eps, w, then)


def _into(cfg: ModelConfig, x: Array, post: Array, scale: Array | None, norm: Array | None) -> NextInput:
    """The hint for a product whose output y joins the stream x by a post-norm (Pending(y, post, scale)) that
    add_normed_matmul takes with the next product, rms-normed by `norm` (None: x' itself)."""
    return NextInput(residual=x, norm=norm, eps=cfg.rms_eps, post_norm=post, scale=scale)


@dataclass
class LayerWeights:
    attn_norm: Array
    qkv: Weight  # group of wq, wk, wv (wq alone in a layer that reads an earlier layer's K/V)
    wo: Weight
    ffn_norm: Array
    gate_up: Weight  # group of w_gate, w_up
    w_down: Weight
    # bqkv: the biases as one vector; qk_norm: [H (+ Hkv), hd] q_norm rows then k_norm rows; post_attn_norm,
    # post_ffn_norm; ple_gate [P, d], ple_proj [d, P], ple_post_norm; layer_scale [1]
    optional: dict[str, Array] = field(default_factory=dict)


@dataclass
class ModelWeights:
    embed: Weight
    output_norm: Array
    output: Weight  # the embedding again when tied
    layers: list[LayerWeights]
    # ple_embed [vocab, n_layers * P], ple_model_proj [n_layers * P, d], ple_proj_norm [P]
    optional: dict[str, Array] = field(default_factory=dict)


def per_layer_inputs(cfg: ModelConfig, weights: ModelWeights, b: Backend, x: Array, ids: Array) -> Array:
    """Gemma 4's per-layer embeddings for tokens `ids` whose scaled embedding is x [n, d]: a row of the PLE
    table (x sqrt(P)) plus the RMS-normed projection of x (x d^-1/2), over sqrt(2) -> [n, n_layers, P]."""
    opt, n, L, P = weights.optional, x.shape[0], cfg.n_layers, cfg.ple_dim
    token = b.embed(opt["ple_embed"], ids, math.sqrt(P)).reshape(n, L, P)
    context = b.matmul(x, opt["ple_model_proj"]) * np.float32(1.0 / math.sqrt(cfg.d_model))
    context = b.rms_norm(context.reshape(n, L, P), opt["ple_proj_norm"], cfg.rms_eps)
    return (context + token) * np.float32(1.0 / math.sqrt(2.0))


def forward(
    cfg: ModelConfig,
    weights: ModelWeights,
    backend: Backend,
    kv: KVCache,
    slot: int,
    ids: np.ndarray,
    pos0: int,
    logit_rows: slice | None,
    interrupt: Callable[[], bool] | None = None,
) -> Array | None:
    """Run tokens `ids` [n] of one sequence at positions pos0.. of `slot`, writing their K/V.

    Returns logits [rows, vocab] for `ids[logit_rows]` (None: no logits, e.g. a prefill chunk that
    is not the last). `interrupt` is asked after every layer; when it says yes the pass stops with
    Interrupted, and the K/V rows it wrote are garbage the caller must not count as resident."""
    batch = Batch((Segment(slot, pos0, tuple(int(t) for t in ids), False),))
    return _forward(cfg, weights, backend, kv, batch, logit_rows, interrupt)


def forward_batch(
    cfg: ModelConfig,
    weights: ModelWeights,
    backend: Backend,
    kv: KVCache,
    batch: Batch,
    interrupt: Callable[[], bool] | None = None,
) -> Array | None:
    """One step of several sequences (batch.py): every segment's tokens at its positions of its slot.
    Returns logits [len(batch.logit_rows), vocab], a row per segment that wants them, in segment order
    (None when none does); `interrupt` as in `forward`, for the whole step."""
    rows = batch.logit_rows
    return _forward(cfg, weights, backend, kv, batch, rows if len(rows) else None, interrupt)


def _forward(
    cfg: ModelConfig,
    weights: ModelWeights,
    backend: Backend,
    kv: KVCache,
    batch: Batch,
    logit_rows: slice | np.ndarray | None,
    interrupt: Callable[[], bool] | None,
) -> Array | None:
    b = backend
    dev_ids = b.stage_batch(batch)
    x = b.embed(weights.embed, dev_ids, cfg.embed_scale)  # [n, d]
    ple = per_layer_inputs(cfg, weights, b, x, dev_ids) if cfg.ple_dim else None
    pending = None  # what the previous layer's output adds to x: taken with this layer's input norm
    try:
        for i, (lw, lc) in enumerate(zip(weights.layers, cfg.layers, strict=True)):
            opt = lw.optional
            # [n, (H + Hkv) * hd + Hkv * hdv]
            x, qkv = _add_matmul(cfg, b, x, pending, lw.attn_norm, lw.qkv)
            if "bqkv" in opt:
                qkv += opt["bqkv"]
            attn = _attention(cfg, b, kv, batch, i, lc, qkv, opt.get("qk_norm"))
            gated = NextInput(act=cfg.activation)
            nxt = None if i + 1 == len(weights.layers) else weights.layers[i + 1].attn_norm  # the next layer's norm
            if "post_attn_norm" in opt:
                post = opt["post_attn_norm"]
                o = Pending(b.matmul(attn, lw.wo, _into(cfg, x, post, None, lw.ffn_norm)), post)
                x, gate_up = _add_matmul(cfg, b, x, o, lw.ffn_norm, lw.gate_up, gated)  # [n, 2 * ffn]
            else:
                o = b.matmul(attn, lw.wo, NextInput(residual=x, norm=lw.ffn_norm, eps=cfg.rms_eps))
                x, gate_up = b.add_norm_matmul(x, o, lw.ffn_norm, cfg.rms_eps, lw.gate_up, gated)
            # the next layer's input norm takes the FFN's output straight from the product, when nothing
            # comes between
            plain_tail = ple is None and not {"post_ffn_norm", "layer_scale"} & opt.keys()
            post, scale = opt.get("post_ffn_norm"), opt.get("layer_scale")
            then = None
            if plain_tail and nxt is not None:
                then = NextInput(residual=x, norm=nxt, eps=cfg.rms_eps)
            elif post is not None and ple is not None:  # the PLE gate's product takes x' itself
                then = _into(cfg, x, post, None, None)
            elif post is not None and nxt is not None:
                then = _into(cfg, x, post, scale, nxt)
            down = b.gated_matmul(gate_up, cfg.activation, lw.w_down, then)
            if ple is None:
                pending = Pending(down, post, scale)
            else:  # the per-layer input's branch reads the stream after the FFN's add; the scale comes after it
                up = ple[:, i]  # one view: the gate's product may code act(gate) * up for the very array
                gated_up = NextInput(act=cfg.activation, up=up)
                x, gate = _add_matmul(cfg, b, x, Pending(down, post), None, opt["ple_gate"], gated_up)
                post = opt["ple_post_norm"]
                then = None if nxt is None else _into(cfg, x, post, scale, nxt)
                branch = b.gated_matmul(gate, cfg.activation, opt["ple_proj"], then, up=up)  # act(gate) * ple_i
                pending = Pending(branch, post, scale)
            if interrupt is not None and interrupt():
                raise Interrupted
    finally:
        if len(batch.segments) > 1:
            b.stage_segment(None)
    if pending is not None:
        x = b.add_normed(x, pending.y, pending.norm, cfg.rms_eps, pending.scale)
    if logit_rows is None:
        return None
    if len(batch.segments) > 1:
        b.stage_rows(tuple(1 for _ in batch.logit_rows))  # a row of each sequence: each alone (base.py)
    h = b.take_rows(x, logit_rows) if isinstance(logit_rows, np.ndarray) else x[logit_rows]
    h = b.rms_norm(h, weights.output_norm, cfg.rms_eps)
    logits = b.matmul(h, weights.output)
    if cfg.final_logit_softcap:
        logits = b.softcap(logits, cfg.final_logit_softcap)
    return logits


def _attention(
    cfg: ModelConfig,
    b: Backend,
    kv: KVCache,
    batch: Batch,
    i: int,
    lc: LayerConfig,
    qkv: Array,
    qk_norm: Array | None,
) -> Array:
    """Layer i's attention, each segment over its own slot -> [n, H * hdv]."""
    layer_kv = kv.layers[cfg.kv_pools[i]]
    many = len(batch.segments) > 1
    # the one-token segments (several streams' decode rows) at once, where the backend can: it fills their rows
    together = None
    if many and sum(1 for s in batch.segments if s.n == 1) > 1:
        together = b.decode_attention(qkv, cfg, lc, qk_norm, layer_kv, batch, shared=lc.kv_source != i)
    outs = []
    for j, seg in enumerate(batch.segments):
        if together is not None and seg.n == 1:
            continue
        if many:
            b.stage_segment(j)
        part = qkv[batch.rows(j)] if many else qkv
        positions = batch.positions(j)
        if lc.kv_source == i:
            outs.append(b.self_attention(part, cfg, lc, qk_norm, positions, layer_kv, seg.slot, seg.pos0))
        else:  # K/V of an earlier layer, already written for these positions
            outs.append(b.shared_attention(part, cfg, lc, qk_norm, positions, layer_kv, seg.slot, seg.pos0))
        if together is not None:
            together[batch.rows(j)] = outs.pop()
    if together is not None:
        return together
    return outs[0] if len(outs) == 1 else b.stack_rows(outs)


def expected_shapes(cfg: ModelConfig, lc: LayerConfig) -> dict[str, tuple[int, ...]]:
    """Numpy-order shape of each role in a layer of config `lc` (and of the global roles); a file that
    disagrees is rejected before any compute."""
    d, hd, hdv, n_kv, ffn, P = cfg.d_model, lc.head_dim, lc.v_head_dim, lc.n_kv_heads, lc.ffn_dim, cfg.ple_dim
    return {
        "attn_norm": (d,),
        "wq": (cfg.n_heads * hd, d),
        "wk": (n_kv * hd, d),
        "wv": (n_kv * hdv, d),
        "wo": (d, cfg.n_heads * hdv),
        "bq": (cfg.n_heads * hd,),
        "bk": (n_kv * hd,),
        "bv": (n_kv * hdv,),
        "q_norm": (hd,),
        "k_norm": (hd,),
        "post_attn_norm": (d,),
        "ffn_norm": (d,),
        "w_gate": (ffn, d),
        "w_up": (ffn, d),
        "w_down": (d, ffn),
        "post_ffn_norm": (d,),
        "ple_gate": (P, d),
        "ple_proj": (d, P),
        "ple_post_norm": (d,),
        "layer_scale": (1,),
        "embed": (cfg.n_vocab, d),
        "output": (cfg.n_vocab, d),
        "output_norm": (d,),
        "ple_embed": (cfg.n_vocab, cfg.n_layers * P),
        "ple_model_proj": (cfg.n_layers * P, d),
        "ple_proj_norm": (P,),
    }
