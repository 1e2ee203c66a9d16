"""The GPU backend on CuPy: weights stay in GGUF block layout on the device.

Products of one row (decode) run a quantized matrix-vector kernel that dequantizes in registers (kernels/quant.cu;
for Q4_K and Q6_K, int8 activations, the tensor cores from compute capability 8.0, else dp4a). Products of 2-64 rows
(the decode rows of a step of several streams, a short prompt) take the n-token kernel where the one-token kernel is
gemv1m, which gives every row its one-row numbers (rows.py). Products of more rows (a prompt chunk) dequantize tiles
of the weight to float32 scratch and multiply on the tensor cores through cuBLAS in TF32: float32's range (float16
inputs overflowed to inf on the synthetic Qwen3 bench models), inputs rounded to 10 mantissa bits, float32
accumulation. RMSNorm, RoPE, the gated activation, the KV write and attention are one fused kernel each
(kernels/layer_ops.cu, kernels/attention.cu); what is left (residual adds, the float32 KV used by tests) is the
NumPy backend's code run on CuPy arrays. Decode steps and prompt chunks of the step sizes are captured as CUDA
graphs and replayed. (A second decode path, the whole step in one cooperative launch, was measured slower and left
the product: bench/NOTES.md v7.)

The package, a noun a file: tuning.py (the knobs, one frozen object), family.py (the kernel paths of a compute
capability), kernels.py (the modules and a kernel's launch), core.py (the device every part shares), step_buffers.py
(what captured steps read), coded.py (what an output hands its consumer), chain.py (products in one launch); the
parts, an object each on the device: weights.py, products.py and rows.py (one row, several), attention.py,
layer_ops.py, steps.py (staged inputs, CUDA graphs); backend.py composes them as CupyBackend. Nothing here imports
CuPy until a backend is built.
"""

from .backend import CupyBackend
from .kernels import COMPAT_ENV, OPS_SOURCES, QUANT_SOURCES, compat_capability, cupy_available, kernel_source
from .tuning import CupyTuning
from .weights import GroupWeight, QuantWeight

__all__ = [
    "COMPAT_ENV",
    "OPS_SOURCES",
    "QUANT_SOURCES",
    "CupyBackend",
    "CupyTuning",
    "GroupWeight",
    "QuantWeight",
    "compat_capability",
    "cupy_available",
    "kernel_source",
]
