"""The CuPy backend: its parts composed (weights and products, attention, the other layer operations, staged
and captured steps; all on the state of core.py)."""

from __future__ import annotations

from ...model_config import ModelConfig
from .attention import CupyAttention, _head_dims_problem
from .layer_ops import CupyLayerOps
from .products import CupyProducts
from .steps import CupySteps


class CupyBackend(CupySteps, CupyAttention, CupyLayerOps, CupyProducts):
    # four streams at once: a step's decode rows share one read of the weights (gemvn, rows.py) and one
    # attention launch a layer (attention_decn); 4B INT8 on the H200 (bench/NOTES.md v13)
    default_parallel = 4
    # a prompt chunk shorter than the engine's prefill_chunk is padded to the next of these and replays that
    # size's captured step: eager, a 33-token prompt's first token took 45 ms on the 4B
    step_buckets = (8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 512)

    def unsupported(self, cfg: ModelConfig) -> str | None:
        for i, lc in enumerate(cfg.layers):
            problem = _head_dims_problem(lc.head_dim, lc.v_head_dim)
            if problem:
                return f"layer {i}: {problem}"
        return None
