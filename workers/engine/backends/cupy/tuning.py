"""The CuPy backend's tuning: one frozen object given at construction (CupyBackend(tuning)); a benchmark
comparing variants in one process asks for another with CupyBackend.retune, which recompiles the kernel
modules whose build-time sizes changed. The defaults are what bench/NOTES.md measured best on the H200."""

from __future__ import annotations

from dataclasses import dataclass, fields

GEMV1_ROWS = 4  # rows per warp of the one-token kernel, GEMV1_ROWS in quant.cu

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
    use_graphs: bool = True  # decode steps and prompt chunks replayed as CUDA graphs
    capture_prefill: bool = True  # full prefill chunks as graphs too (the engine says which shapes repeat)
    use_pdl: bool = True  # programmatic dependent launch in captured steps (pdl.py; compute capability 9.0)
    # the one-token GEMVs' rows per warp: as many as keep gemv_blocks_per_sm blocks per SM, at most gemv_max_rows
    gemv_blocks_per_sm: int = 2
    gemv_max_rows: int = GEMV1_ROWS
    gemv_split_warps: int = 32  # rows split over warps below this many warps per SM (0: never split)
    # one-token attention as attention_dec, ATT_CL blocks a KV head (a cluster on 9.0, attention_decg on 8.x)
    use_clusters: bool = True
    use_decode_rows: bool = True  # a step's one-token segments' attention in one launch (attention_decn)
    # ... as attention_decb (a block a row and KV head, no clusters) from this many rows x KV heads: at 16 streams
    # of 4B (128 blocks, one wave) attention_decn's 128 clusters of 8 ran in three waves (62 fit at once)
    decb_min_blocks: int = 64
    # 8.x: attention_decg's blocks a KV head (1 to 32; 0: as many as the SMs hold one a KV head's,
    # CupyAttention._dec_ranks), and (dec_rank_tasks, compiled in; 0: all of them) as many of those a position as
    # give each that many tasks of 8 keys: on an H100 the 4B decoded +3 % at depth 4096 and 1.45x llama.cpp on 8
    # SMs (bench/NOTES.md v26), and the sm87 GPU suite passed (v27). They define the arithmetic, so alone and
    # batched always agree.
    dec_ranks: int = 0
    # steps mixing prompt chunks with decode rows captured by shape: a 33-token voice prompt under 7 streams
    # 33.3 -> 17.7 ms to its first token (bench/NOTES.md v16)
    capture_mixed: bool = True
    use_epilogues: bool = True  # NextInput hints coded by the producing kernel (off: q8_input launches)
    # ... and, where the kernel family chains (8.x), run in one launch with it (chain.py): +11 % decode on the 8.x
    # paths with the same logits (bench/NOTES.md v25, and 2026-12-06 for the sm87 GPU suite with it on)
    use_chains: bool = True
    # ... on 9.0 too, in the chain's cp.async form (the same numbers), where its products otherwise overlap by
    # programmatic dependent launch alone: a bench's knob, off, as it lost on an H100 (the 4B 444 -> 411 tok/s at one
    # stream, 757 -> 694 at two; E2B 413 -> 390, 698 -> 662: bench/NOTES.md, session 2026-12-07f)
    chains_90: bool = False
    # ... and, where products chain, a step's rows whose products take one group of four tokens a block (2-4
    # streams; gemvn_chainc): 8.x paths on an H100, 2 / 4 streams, the 4B 614 -> 688 / 1 205 -> 1 366 tok/s, the
    # 0.6B 1 554 -> 1 631 / 3 085 -> 3 248, E2B 580 -> 586 / 1 139 -> 1 152 (bench/NOTES.md, session 2026-12-07f)
    chain_rows: bool = True
    # a post-norm's NextInput hint coded by its producing product too (EP_POSTNORM: the last block computes x' and the
    # next codes): off, as that one block's row-long tail cost more than the launch it saves: E2B decode @0 / @4096
    # on an H100 412 / 374 tok/s without it, 335 / 308 with it; 8.x 370 / 349 against 299 / 283 (bench/NOTES.md,
    # session 2026-12-07e)
    post_epilogues: bool = False
    # Q4_K/Q6_K products on the tensor cores (gemv1m, gemvn; 8.0 and later)
    use_mma: bool = True
    mma_threads: int = 256
    mma_blocks_per_sm: int = 2
    gemvn_groups: int = 2  # groups of four tokens a block of the n-token product (1, 2 or 4: gemvn{1,2,4}_*)
    # ... and of a Q4_K matrix whose rows take several column stages (more than 2 560 values): bench/gpu_rows.py
    # at 16 / 40 tokens, o (2 560 x 4 096) 12.0 -> 9.7 / 25.0 -> 19.8 µs, down (2 560 x 9 728) 28.1 -> 21.8 /
    # 56.1 -> 44.3 µs; the other matrices were as fast or faster with 2 (bench/NOTES.md v17)
    gemvn_groups_staged: int = 4
    # ... and of a Q4_K matrix of at least 4 tiles of 16 rows a block slot (the 4B's gate_up: 1 216 tiles, 264
    # slots) for up to 16 tokens: gate_up at 16 tokens 35.5 -> 32.0 µs (v20; v17 alike), but 81.9 -> 84.2 at 40 (v17)
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
    # mantissa at twice its tensor rate, float16's range), 2 bfloat16 (FAST_16BF: float32's range, 7 bits); benches
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
