"""`gemma3` (Gemma 3 text). What the metadata does not say, llama.cpp hard-codes and so do we:
every 6th layer is global (the others see a sliding window), sliding layers use RoPE base 10 000
without scaling, embeddings are multiplied by sqrt(d_model), the FFN is gated GELU-tanh, and the
attention scale is 1/sqrt(head_dim) (1/sqrt(d_model/n_heads) for the 27B model). Norm weights are
stored with Gemma's +1 already folded in."""

import math
from dataclasses import replace

from ..model_config import LayerConfig, MetaReader, ModelConfig, base_config
from .spec import BASE_LAYER_ROLES, ArchSpec

SLIDING_PATTERN = 6  # layer i is global iff i % 6 == 5
SLIDING_ROPE_BASE = 10_000.0


def read_config(r: MetaReader, n_vocab: int) -> ModelConfig:
    cfg = base_config(r, n_vocab)
    window = r.get_int("attention.sliding_window", 0)
    global_base = r.get_float("rope.freq_base", 1_000_000.0)
    global_scale = r.rope_scale()
    layers = tuple(
        LayerConfig(global_base, global_scale, 0)
        if i % SLIDING_PATTERN == SLIDING_PATTERN - 1
        else LayerConfig(SLIDING_ROPE_BASE, 1.0, window)
        for i in range(cfg.n_layers)
    )
    is_27b = cfg.n_layers == 62
    head_scale = cfg.d_model // cfg.n_heads if is_27b else cfg.head_dim
    return replace(
        cfg,
        rope_mode="neox",
        activation="gelu_tanh",
        embed_scale=math.sqrt(cfg.d_model),
        attn_scale=1.0 / math.sqrt(head_scale),
        layers=layers,
    )


SPEC = ArchSpec(
    name="gemma3",
    read_config=read_config,
    layer_roles=BASE_LAYER_ROLES + ("q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"),
)
