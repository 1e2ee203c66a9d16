"""The CuPy backend's tuning: the alternatives of its paths, one frozen object given at construction
(CupyBackend(tuning)). The product runs the defaults and changes none of them; the GPU tests take each other value
to check that the paths agree (bench/NOTES.md, "The CuPy backend as parts"), and benches compare values in one
process through CupyBackend.retune, which rebuilds the kernel modules whose compiled sizes changed. What no test
varies is the only path, or a constant beside its kernel (products.py's GEMV_*). Each default's measurement
is in bench/NOTES.md under the version or session named."""

from __future__ import annotations

from dataclasses import dataclass, fields

ATTENTION_CLUSTER = 8  # ATT_CL in attention.cu: blocks a KV head of attention_dec (9.0: a cluster)

DEC_MAX_RANKS = 32  # attention_decg's blocks a KV head at most (attention.cu's dec_head merges the ranks a lane each)

# the knobs compiled into a module (-DNAME=value): module, define, its default in the source
DEFINES = {
    "octet_units": ("quant", "OCTET_UNITS", 2),
    "pf_warps": ("ops", "PF_WARPS", 4),
    "dec_max_warps": ("ops", "DEC_MAX_WARPS", 16),
    "decn_warps": ("ops", "DECN_WARPS", 4),
    "dec_rank_tasks": ("ops", "DEC_RANK_TASKS", 8),
}


@dataclass(frozen=True)
class CupyTuning:
    use_graphs: bool = True  # decode steps and prompt chunks replayed as CUDA graphs (off: every step eager)
    use_pdl: bool = True  # programmatic dependent launch in captured steps (pdl.py; compute capability 9.0)
    # a step's one-token rows' attention as attention_decb (a block a row and KV head) from this many rows x KV
    # heads, where clusters of ATT_CL would run in several waves (v18)
    decb_min_blocks: int = 64
    # 8.x: attention_decg's blocks a KV head (1 to 32; 0: as many as the SMs hold one a KV head's,
    # CupyAttention._dec_ranks), and (dec_rank_tasks, compiled in; 0: all of them) as many of those a position as
    # give each that many tasks of 8 keys (v26, v27). They define the arithmetic, so alone and batched agree.
    dec_ranks: int = 0
    # products that code their consumer's input run in one launch with it where the family chains (8.x: no
    # programmatic dependent launch to overlap them otherwise; chain.py, v25), a step's rows of one group too
    use_chains: bool = True
    chains_90: bool = False  # ... on 9.0 too: it lost to programmatic dependent launch (session 2026-12-07f)
    # a post-norm's hint coded by its producing product too (EP_POSTNORM): its last block's row-long tail cost more
    # than the launch it saves (session 2026-12-07e)
    post_epilogues: bool = False
    # Q4_K/Q6_K products on the tensor cores (gemv1m, gemvn; 8.0 and later; off: gemv1q's dp4a, a T4's path)
    use_mma: bool = True
    mma_threads: int = 256
    mma_blocks_per_sm: int = 2
    gemvn_groups: int = 2  # groups of four tokens a block of the n-token product (1, 2 or 4: gemvn{1,2,4}_*)
    # ... of a Q4_K matrix whose rows take several column stages (more than 2 560 values: o, down; v17)
    gemvn_groups_staged: int = 4
    # ... of a Q4_K matrix of at least 4 tiles of 16 rows a block slot for up to 16 tokens (gate_up; v17, v20)
    gemvn_groups_wide: int = 4
    # compiled in (DEFINES)
    octet_units: int = 2  # blocks a lane of the dp4a GEMV loads before using any (OCTET_UNITS)
    mma_ilp: int = -1  # gemv1m's items (MMA_ILP: 0 or 1); -1: its kernel family's (family.py)
    mma_stages: int = 0  # gemv1m's ring of stages (MMA_STAGES); 0: its kernel family's (quant_consts.py)
    pf_warps: int = 4  # the prefill attention's warps a block, 16 query rows each (PF_WARPS)
    dec_max_warps: int = 16  # attention_dec's warps a block at most (DEC_MAX_WARPS)
    decn_warps: int = 4  # attention_decn's warps a block (DECN_WARPS: 4, 8 or 16; at most attention_dec's)
    dec_rank_tasks: int = 8  # DEC_RANK_TASKS (above, dec_ranks)
    # the prefill GEMM's inputs inside cuBLAS (float32 arrays either way): 0 TF32, 1 float16 (FAST_16F: TF32's 10-bit
    # mantissa at twice its tensor rate, float16's range), 2 bfloat16 (FAST_16BF: float32's range, 7 bits)
    prefill_gemm: int = 0

    def __post_init__(self) -> None:
        if self.decn_warps not in (4, 8, 16):
            raise ValueError(f"decn_warps must be 4, 8 or 16, not {self.decn_warps}")
        for name in ("gemvn_groups", "gemvn_groups_staged", "gemvn_groups_wide"):
            if getattr(self, name) not in (1, 2, 4):
                raise ValueError(f"{name} must be 1, 2 or 4, not {getattr(self, name)}")
        if self.mma_ilp not in (-1, 0, 1):
            raise ValueError(f"mma_ilp must be -1 (the kernel family's), 0 or 1, not {self.mma_ilp}")
        if self.prefill_gemm not in (0, 1, 2):
            raise ValueError(f"prefill_gemm must be 0 (TF32), 1 (float16) or 2 (bfloat16), not {self.prefill_gemm}")
        if self.dec_ranks > DEC_MAX_RANKS:
            raise ValueError(f"dec_ranks must be at most {DEC_MAX_RANKS}, not {self.dec_ranks}")
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool) and value < 0 and f.name != "mma_ilp":
                raise ValueError(f"{f.name} must not be negative, not {value}")

    def options(self, module: str) -> tuple[str, ...]:
        """The -D options `module` ("quant" or "ops") is compiled with: only the sizes that differ from the
        source's own (an unchanged module keeps its place in CuPy's disk cache)."""
        return tuple(
            f"-D{define}={getattr(self, name)}"
            for name, (mod, define, default) in DEFINES.items()
            if mod == module and getattr(self, name) != default
        )
