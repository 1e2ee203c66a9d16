"""`llama` (SmolLM2, Llama 2/3). llama.cpp's converter permutes Q and K rows for its interleaved
("NORM") RoPE, so rotating adjacent pairs on the stored weights is exact."""

from ..model_config import MetaReader, ModelConfig, base_config
from .spec import ArchSpec


def read_config(r: MetaReader, n_vocab: int) -> ModelConfig:
    return base_config(r, n_vocab, rope_mode="norm")


SPEC = ArchSpec(name="llama", read_config=read_config, optional_layer_roles=("bq", "bk", "bv"))
