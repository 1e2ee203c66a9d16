"""What an architecture file declares: how to read its hyper-parameters and which tensors it needs.

Tensor roles are named once here with their GGUF names; an architecture lists the roles it requires
and those it may have. The forward pass (`layers.py`) is shared and reads roles, never GGUF names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..model_config import MetaReader, ModelConfig

# role -> GGUF tensor name ({i} is the layer index)
GLOBAL_TENSORS = {
    "embed": "token_embd.weight",
    "output_norm": "output_norm.weight",
    "output": "output.weight",
    # per-layer embeddings (Gemma 4): a token table and a projection of the embedding, [n, n_layers * P]
    "ple_embed": "per_layer_token_embd.weight",
    "ple_model_proj": "per_layer_model_proj.weight",
    "ple_proj_norm": "per_layer_proj_norm.weight",
}
LAYER_TENSORS = {
    "attn_norm": "blk.{i}.attn_norm.weight",
    "wq": "blk.{i}.attn_q.weight",
    "wk": "blk.{i}.attn_k.weight",
    "wv": "blk.{i}.attn_v.weight",
    "wo": "blk.{i}.attn_output.weight",
    "bq": "blk.{i}.attn_q.bias",
    "bk": "blk.{i}.attn_k.bias",
    "bv": "blk.{i}.attn_v.bias",
    "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight",
    "post_attn_norm": "blk.{i}.post_attention_norm.weight",
    "ffn_norm": "blk.{i}.ffn_norm.weight",
    "w_gate": "blk.{i}.ffn_gate.weight",
    "w_up": "blk.{i}.ffn_up.weight",
    "w_down": "blk.{i}.ffn_down.weight",
    "post_ffn_norm": "blk.{i}.post_ffw_norm.weight",
    "ple_gate": "blk.{i}.inp_gate.weight",  # Gemma 4: the layer's PLE branch, added after the FFN
    "ple_proj": "blk.{i}.proj.weight",
    "ple_post_norm": "blk.{i}.post_norm.weight",
    "layer_scale": "blk.{i}.layer_output_scale.weight",  # [1], multiplies the residual stream
}
BASE_LAYER_ROLES = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
# what a layer that reads an earlier layer's K/V (ModelConfig: kv_source) neither needs nor reads
KV_ROLES = frozenset({"wk", "wv", "bk", "bv", "k_norm"})


@dataclass(frozen=True)
class ArchSpec:
    name: str
    read_config: Callable[[MetaReader, int], ModelConfig]  # (metadata, n_vocab) -> config
    layer_roles: tuple[str, ...] = BASE_LAYER_ROLES  # required in every layer (KV_ROLES only where it owns K/V)
    optional_layer_roles: tuple[str, ...] = ()
    global_roles: tuple[str, ...] = ()  # required beyond embed, output_norm (and output, or tied)
