"""What every part of the CuPy backend shares (backend.py composes the parts on it): the device and the kernel family
its capability runs, the compiled kernel modules and the launch of a kernel by name, where the kernels read the
step's position and slot, the buffers captured steps read (step_buffers.py), whether a step is being captured, and
the products held for one launch (chain.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gguf import GGMLQuantizationType

from genie_common import env

from .capture_gemm import CaptureGemm
from .chain import Chain
from .family import family_of
from .kernels import (
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


class CupyDevice:
    def __init__(self, tuning: CupyTuning) -> None:
        import cupy

        self.xp = cupy
        self.tuning = tuning
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        self.n_sm = int(props["multiProcessorCount"])
        self.smem_per_sm = int(props["sharedMemPerMultiprocessor"])
        self.smem_per_block = int(props["sharedMemPerBlockOptin"])  # dynamic and static, opted in
        self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        # the kernel paths of this capability (family.py); GENIE_CUDA_COMPAT (sm87, 8.7) takes an older GPU's
        self.capability = compat_capability((int(props["major"]), int(props["minor"])), env.cuda_compat())
        self.family = family_of(self.capability)
        self.pdl = dependent_launcher() if self.family.paths_90 else None
        self.modules = {
            "quant": kernel_module(*QUANT_SOURCES, options=self.options("quant", tuning)),
            "ops": kernel_module(*OPS_SOURCES, options=self.options("ops", tuning)),
        }
        for module in self.modules.values():
            module.compile()  # now, not mid-generation: a compile failure is a start-up error
        self.kernels: dict[str, Kernel] = {}
        self.buffers = StepBuffers(cupy)  # what captured steps read
        # where the kernels read the staged first position and K/V slot (AT_SLOT in common.cuh): the step's, or a
        # segment's (stage_segment); and that slot as the host knows it (attention.py checks it)
        self.pos = self.buffers.step_pos
        self.slot = 0
        self.step_slot = 0
        self.segment_slots: tuple[int, ...] = ()
        self.row_groups: tuple[int, ...] = ()  # stage_rows: the products' rows in independent groups
        self.capturing = False
        self.capture_gemm: CaptureGemm | None = None  # the prefill GEMM while capturing (capture_gemm.py)
        # products held for one launch (8.x, chain.py): every other launch sends them first (Kernel.__call__)
        self.chain = Chain(cupy, lambda n: self.kernel_named("gemvn_chainc" if n else "gemv1_chainc"), self.n_sm)

    def options(self, module: str, tuning: CupyTuning) -> tuple[str, ...]:
        """A module's build options: the tuning's sizes, the products' ring (MMA_STAGES) and items (MMA_ILP), and
        the kernel family of the capability whose paths run (PATHS_90: bulk copies and clusters, 9.0; else cp.async
        and the global merge, 8.x): each module holds one family's kernels, not both (the 8.x attention kernels
        tripled its compile time)."""
        ilp = self.family.mma_ilp if tuning.mma_ilp < 0 else tuning.mma_ilp
        ring = (f"-DMMA_STAGES={self.stages(tuning)}", f"-DMMA_ILP={int(ilp)}") if module == "quant" else ()
        return (*tuning.options(module), *ring, f"-DPATHS_90={int(self.family.paths_90)}")

    def stages(self, tuning: CupyTuning) -> int:
        """gemv1m's and gemvn's ring of weight stages: the tuning's, else the kernel family's."""
        return tuning.mma_stages or self.family.mma_stages

    def kernel(self, op: str, qtype: GGMLQuantizationType) -> Kernel:
        """quant.cu's kernel `op` for weights of this type."""
        return self.kernel_named(f"{op}_{KERNEL_TYPES[qtype]}")

    def kernel_named(self, name: str) -> Kernel:
        """quant.cu's kernel of this name."""
        if name not in self.kernels:
            self.kernels[name] = Kernel(self.modules["quant"].get_function(name), self)
        return self.kernels[name]

    def op(self, name: str) -> Kernel:
        """layer_ops.cu's or attention.cu's kernel of this name."""
        if name not in self.kernels:
            self.kernels[name] = Kernel(self.modules["ops"].get_function(name), self)
        return self.kernels[name]

    @property
    def dependent_launch(self) -> bool:
        """Whether the kernels of a step being captured are launched with programmatic dependent launch."""
        return self.capturing and self.tuning.use_pdl and self.pdl is not None

    def retune(self, **changes: Any) -> None:
        """Another tuning (benchmarks comparing variants in one process): the kernel modules whose compiled
        sizes changed are built again, and captured steps are captured again."""
        tuning = replace(self.tuning, **changes)
        sources = {"quant": QUANT_SOURCES, "ops": OPS_SOURCES}
        for module, files in sources.items():
            if self.options(module, tuning) != self.options(module, self.tuning):
                self.modules[module] = kernel_module(*files, options=self.options(module, tuning))
                self.modules[module].compile()
                self.kernels.clear()
        self.tuning = tuning
        self.buffers.replaced()
