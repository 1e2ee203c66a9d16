"""`qwen3` (dense Qwen3): per-head RMSNorm on Q and K before NEOX RoPE; no biases."""

from ..model_config import MetaReader, ModelConfig, base_config
from .spec import BASE_LAYER_ROLES, ArchSpec


def read_config(r: MetaReader, n_vocab: int) -> ModelConfig:
    return base_config(r, n_vocab, rope_mode="neox")


SPEC = ArchSpec(name="qwen3", read_config=read_config, layer_roles=BASE_LAYER_ROLES + ("q_norm", "k_norm"))
