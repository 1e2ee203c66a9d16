"""What every part of the CuPy backend shares: the device, its compute capability, the compiled kernel modules
and the launch of a kernel by name, the buffers captured steps read (step_buffers.py), and memory. The parts
(weights.py, products.py, attention.py, layer_ops.py, steps.py) are classes on this one, composed by backend.py."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from gguf import GGMLQuantizationType

from genie_common import env
from genie_common.gguf_file import TensorInfo

from ...model_config import ModelConfig
from ..base import Backend
from ..numpy_backend import NumpyBackend
from .capture_gemm import CaptureGemm
from .chain import Chain
from .family import family_of
from .host_copies import PinnedStaging
from .kernels import (
    COMPAT_ENV,
    KERNEL_TYPES,
    OPS_SOURCES,
    QUANT_SOURCES,
    Kernel,
    compat_capability,
    dependent_launcher,
    kernel_module,
)
from .step_buffers import StepBuffers
from .tuning import CupyTuning

# float32 weight scratch of the prefill path: the GPU memory bound allows no more. A captured prefill chunk keeps
# its scratch in the captures' pool, but smaller tiles there cost more than they save: 8 MiB halved the 4B's
# pp512 (15.9 k -> 8.4 k tok/s on the H200; tiles of 256 rows make the down projection's GEMMs thin)
PREFILL_SCRATCH_BYTES = 32 << 20


TUNING_FIELDS = frozenset(f.name for f in fields(CupyTuning))


class CupyCore(NumpyBackend):
    name = "cupy"
    launches_ahead = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name in TUNING_FIELDS:  # once an attribute: set here it would be ignored, silently
            raise AttributeError(f"{name} is part of the backend's tuning: backend.retune({name}=...)")
        super().__setattr__(name, value)

    def __init__(self, tuning: CupyTuning | None = None) -> None:
        import cupy

        self.xp = cupy
        super().__init__(block_kernels=False)  # its own kernels; the CPU ones are never built here
        self.tuning = tuning or CupyTuning()
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        self.n_sm = int(props["multiProcessorCount"])
        self._smem_per_sm = int(props["sharedMemPerMultiprocessor"])
        self._smem_per_block = int(props["sharedMemPerBlockOptin"])  # dynamic and static, opted in
        self._device_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        # the kernel paths of this capability (family.py); GENIE_CUDA_COMPAT (sm87, 8.7) takes an older GPU's
        self.capability = compat_capability((int(props["major"]), int(props["minor"])), env.cuda_compat())
        self.family = family_of(self.capability)
        self._pdl = dependent_launcher() if self.family.paths_90 else None
        self._module = kernel_module(*QUANT_SOURCES, options=self._options("quant", self.tuning))
        self._ops = kernel_module(*OPS_SOURCES, options=self._options("ops", self.tuning))
        for module in (self._module, self._ops):
            module.compile()  # now, not mid-generation: a compile failure is a start-up error
        self._kernels: dict[str, Kernel] = {}
        self.buffers = StepBuffers(cupy)  # what captured steps read (step_buffers.py)
        # the staged first position and K/V slot the kernels read (AT_SLOT in common.cuh): the step's, or a
        # segment's (stage_segment)
        self._pos = self.buffers.step_pos
        self._slot = 0  # the slot staged where _pos points, as the host knows it (attention.py checks it)
        self._step_slot = 0
        self._segment_slots: tuple[int, ...] = ()
        self._argmax_buf: tuple[Any, ...] | None = None
        self._ahead: Any = None  # greedy_ahead's last tokens (DeviceTokens), and the pinned buffer they come back to
        self._ahead_pinned: Any = None
        # the decode step staged last, (slot, position) a row, while the buffers hold it (replay_ahead moves it on)
        self._staged_decode: tuple[tuple[int, int], ...] | None = None
        self._capturing = False
        self._capture_gemm: CaptureGemm | None = None
        # Every captured step allocates from this one pool, never from the default one, so nothing eager is ever
        # handed a buffer a graph writes. One pool for all of them: the steps replay one at a time on one stream,
        # and each reads only its own intermediates, written earlier in the same replay; its output stays
        # allocated while the step exists. So a step may reuse another's intermediates, and the pool holds the
        # largest step (a 4B prefill chunk of 512 tokens, ~0.2 GiB) rather than the sum of all of them. The
        # price: a replayed step's output is valid until the next step runs (the engine samples it at once).
        self._capture_pool = cupy.cuda.MemoryPool()
        # and one stream to capture on: CuPy's pool hands a freed block only to allocations on the stream it was
        # freed on, so a new stream per capture would share nothing
        self._capture_stream = cupy.cuda.Stream(non_blocking=True)
        self._copy_stream = cupy.cuda.Stream(non_blocking=True)  # start_to_host's copies (host_copies.py)
        self._staging = PinnedStaging(cupy)  # ... and the pinned buffer they go through
        self._gather_tables: dict[tuple[int, ...], tuple[Any, int]] = {}  # gather_slot's, by the arrays' addresses
        # products held for one launch (8.x, chain.py): every other launch sends them first (Kernel.__call__)
        self._chain = Chain(cupy, lambda n: self._kernel_named("gemvn_chainc" if n else "gemv1_chainc"), self.n_sm)

    def _options(self, module: str, tuning: CupyTuning) -> tuple[str, ...]:
        """A module's build options: the tuning's sizes, the products' ring (MMA_STAGES) and items (MMA_ILP), and
        the kernel family of the capability whose paths run (PATHS_90: bulk copies and clusters, 9.0; else cp.async
        and the global merge, 8.x): each module holds one family's kernels, not both (the 8.x attention kernels
        tripled its compile time)."""
        ilp = self.family.mma_ilp if tuning.mma_ilp < 0 else tuning.mma_ilp
        ring = (f"-DMMA_STAGES={self._stages(tuning)}", f"-DMMA_ILP={int(ilp)}") if module == "quant" else ()
        return (*tuning.options(module), *ring, f"-DPATHS_90={int(self.family.paths_90)}")

    def _stages(self, tuning: CupyTuning) -> int:
        """gemv1m's and gemvn's ring of weight stages: the tuning's, else the kernel family's."""
        return tuning.mma_stages or self.family.mma_stages

    @property
    def captures_steps(self) -> bool:  # type: ignore[override]
        return self.tuning.use_graphs

    @property
    def device_name(self) -> str:
        forced = f", {COMPAT_ENV}={self.capability[0]}.{self.capability[1]}" if env.cuda_compat() else ""
        return f"cupy ({self._device_name}{forced})"

    def _kernel(self, op: str, qtype: GGMLQuantizationType) -> Kernel:
        return self._kernel_named(f"{op}_{KERNEL_TYPES[qtype]}")

    def _kernel_named(self, name: str) -> Kernel:
        if name not in self._kernels:
            self._kernels[name] = Kernel(self._module.get_function(name), self)
        return self._kernels[name]

    def _op(self, name: str) -> Kernel:
        if name not in self._kernels:
            self._kernels[name] = Kernel(self._ops.get_function(name), self)
        return self._kernels[name]

    @property
    def dependent_launch(self) -> bool:
        """Whether the kernels of a step being captured are launched with programmatic dependent launch."""
        return self._capturing and self.tuning.use_pdl and self._pdl is not None

    # -- memory -------------------------------------------------------------------------------------
    def weight_bytes(self, tensors: list[TensorInfo], matrix: bool) -> int:
        return Backend.weight_bytes(self, tensors, matrix)  # GGUF blocks as stored (not NumPy's int8 rows)

    def kv_zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.xp.zeros(shape, dtype=dtype)  # device memory, allocated whole (NumPy's host mapping is not)

    def free_memory(self) -> int:
        return int(self.xp.cuda.runtime.memGetInfo()[0])

    def release_memory(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()
        self.xp.get_default_pinned_memory_pool().free_all_blocks()

    def scratch_bytes(self, cfg: ModelConfig, prefill_chunk: int, n_slots: int) -> tuple[int, int]:
        # a step's arrays, once more for the pool the captured steps allocate from, and the prefill GEMM's
        # dequantized tile; attention keeps no per-key scores (flash-style kernels)
        acts, _ = Backend.scratch_bytes(self, cfg, prefill_chunk, n_slots)
        return 2 * acts + PREFILL_SCRATCH_BYTES, 0

    def retune(self, **changes: Any) -> None:
        """Another tuning (benchmarks comparing variants in one process): the kernel modules whose compiled
        sizes changed are built again, and captured steps are captured again."""
        tuning = replace(self.tuning, **changes)
        modules = {"quant": QUANT_SOURCES, "ops": OPS_SOURCES}
        for module, files in modules.items():
            if self._options(module, tuning) != self._options(module, self.tuning):
                built = kernel_module(*files, options=self._options(module, tuning))
                built.compile()
                if module == "quant":
                    self._module = built
                else:
                    self._ops = built
                self._kernels.clear()
        self.tuning = tuning
        self.buffers.replaced()
