"""`qwen2` (Qwen2, Qwen2.5): biases on Q, K and V; NEOX RoPE."""

from ..model_config import MetaReader, ModelConfig, base_config
from .spec import BASE_LAYER_ROLES, ArchSpec


def read_config(r: MetaReader, n_vocab: int) -> ModelConfig:
    return base_config(r, n_vocab, rope_mode="neox")


SPEC = ArchSpec(name="qwen2", read_config=read_config, layer_roles=BASE_LAYER_ROLES + ("bq", "bk", "bv"))
