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
}
BASE_LAYER_ROLES = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")


@dataclass(frozen=True)
class ArchSpec:
    name: str
    read_config: Callable[[MetaReader, int], ModelConfig]  # (metadata, n_vocab) -> config
    layer_roles: tuple[str, ...] = BASE_LAYER_ROLES  # required in every layer
    optional_layer_roles: tuple[str, ...] = ()
