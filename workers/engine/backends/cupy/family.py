"""The kernel family a GPU runs: the paths of its compute capability, one value chosen at start (family_of), which
every part of the CuPy backend asks instead of comparing capabilities. Each kernel module is built for one
family (PATHS_90), so a family's kernels are the ones its module holds.

- 9.0 and later (H100, H200): the Q4_K/Q6_K products on the tensor cores with their weights streamed by bulk
  copies (gemv1m, gemvn*; a prompt chunk's sets of 3, 5 and 8 groups by cp.async, gemvnc*), one-token attention
  as thread-block clusters (attention_dec, attention_decn), and programmatic dependent launch in captured steps
  (pdl.py).
- 8.x (Jetson Orin 8.7, RTX 30 8.6, RTX 40 8.9, A100 8.0): the same products streamed by cp.async (gemv1mc,
  gemvnc*), the same attention merged through global memory (attention_decg, attention_decgn), the same numbers;
  products that feed each other chained into one launch (chain.py: one token's, and a step's 2-4 rows').
- Before 8.0: the dp4a products (gemv1q) and the per-layer attention kernels only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelFamily:
    name: str
    paths_90: bool  # bulk copies, clusters and programmatic dependent launch; the modules' -DPATHS_90
    products: tuple[str, str] | None  # the tensor-core products' kernels: one token, n tokens (None: dp4a only)
    decode_attention: tuple[str, str] | None  # one-token attention in one launch: one row, a step's rows
    # the products' ring of weight stages (MMA_STAGES): 3 with bulk copies; 2 with cp.async, faster on few SMs
    # and on many (bench/NOTES.md v23), and a Q6_K ring with its input then fits an RTX 30's 99 KiB a block
    mma_stages: int
    # gemv1m's items (MMA_ILP): their four mmas each of its own and two items a pass, not one chain of four: 8.x
    # decoded +0-3 % with the same numbers (bench/NOTES.md v28); 9.0 keeps the chain, not measured otherwise
    mma_ilp: bool
    # products that feed each other in one launch (chain.py, gemv1_chainc and gemvn_chainc): 8.x, which has no
    # programmatic dependent launch to start a product's weights before its predecessor ends (9.0: a bench's
    # knob, CupyTuning.chains_90)
    chains: bool
    # gemvn's instantiations for Q4_K and Q6_K: groups of four tokens a block (quant.cu). A prompt chunk of more than
    # four groups takes the count rows.prompt_groups finds fastest; a step's decode rows take 1, 2 or 4
    n_groups: tuple[tuple[int, ...], tuple[int, ...]] = ((1, 2, 4), (1, 2, 4))
    # the counts whose gemvn streams its weights by cp.async even where the family's products take bulk copies
    # (gemvnc*: the same bytes in the same places, so the same numbers): on 9.0 the bulk form of 3, 5 and 8 groups
    # spills (sm_90: 5 groups 148 bytes, 8 356), the cp.async form not or hardly (0, 20, 4)
    n_cp_async: tuple[int, ...] = ()

    def gemvn(self, groups: int) -> str:
        """The name (without its type) of the n-token product taking this many groups of four tokens a block."""
        assert self.products is not None
        return f"{self.products[1]}{'c' if groups in self.n_cp_async else ''}{groups}"


GROUPS_8X = ((1, 2, 3, 4, 5, 8), (1, 2, 3, 4, 5))  # quant.cu's gemvnc instantiations (both families): Q4_K's, Q6_K's
HOPPER = KernelFamily(
    "9.0", True, ("gemv1m", "gemvn"), ("attention_dec", "attention_decn"), 3, False, False, GROUPS_8X, (3, 5, 8)
)
AMPERE = KernelFamily(
    "8.x", False, ("gemv1mc", "gemvnc"), ("attention_decg", "attention_decgn"), 2, True, True, GROUPS_8X
)
OLDER = KernelFamily("before 8.0", False, None, None, 2, False, False)


def family_of(capability: tuple[int, int]) -> KernelFamily:
    """The family whose paths a GPU of this compute capability runs (GENIE_CUDA_COMPAT gives an older one)."""
    if capability >= (9, 0):
        return HOPPER
    return AMPERE if capability >= (8, 0) else OLDER
