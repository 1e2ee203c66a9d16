"""What quant.cu and common.cuh are built with, as the Python side launches them: block sizes, shared-memory
layouts, limits and the codes of modes and activations (each named after its definition there)."""

from gguf import GGMLQuantizationType

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # the kernels' activation codes (common.cuh)
_X_GATED, _X_NORM = 1, 2  # q8_input's modes in quant.cu (X_NORM_LATE: rows.py)
_EP_NONE, _EP_GATED, _EP_NORM, _EP_POSTNORM, _EP_GATED_UP = 0, 1, 2, 3, 4  # the dp4a products' epilogues (quant.cu)
Q8_THREADS = 1024  # q8_input's block (a block an input row)
EP_MAX_ROWS = 224  # rows a block of a product with an epilogue (EP_MAX_GROUPS in quant.cu: 8 groups a run)
MMA_UNITS = 10  # MMA_U: 256-value units a column stage of gemv1m and gemvn (a Qwen3 row of 2 560 values is one)
MMA_ROW_BYTES = {GGMLQuantizationType.Q4_K: MMA_UNITS * 144 + 32, GGMLQuantizationType.Q6_K: 2128}
MMA_STATIC_SMEM = 4096  # gemv1m's static shared memory (2 208 bytes) and the 1 KiB the GPU reserves a block
MMA_MAX_THREADS = 512  # its __launch_bounds__
GEMVN_MAX_GROUPS = 8  # the most groups of four tokens a block of gemvn takes (KernelFamily.n_groups)
Q8_MAX_COLS = 16 * Q8_THREADS  # Q8_MAX values per thread
QA_MAX_COLS = 8 * Q8_THREADS  # q8_add_normed's QA_MAX values per thread
