"""Products chained into one launch on compute capability 8.x (quant.cu's gemv1_chainc for one token, gemvn_chainc for
a step's rows in one group of four tokens a block); on 9.0 where a bench asks (CupyTuning.chains_90).

8.x has no programmatic dependent launch, so each product kernel of a decode step starts only once the one
before has drained, and its first weights are requested only then. A product whose output only the next
product reads (it codes that product's input in its epilogue: NextInput) is not launched at once but held
here; the products that follow join it, and the whole run goes out as one launch when anything else is
launched (Kernel.__call__ flushes first) or a product's output is wanted by other code (a product without
`then`). In that launch each block runs its block of every product in turn and waits, its next weights already
requested, only for the blocks of the product whose output it reads: a layer's o, gate/up and down and the
next layer's q/k and v become one launch. A product that does not read its predecessor (v beside q/k) runs on
the blocks after that one's where they fit (`_bases`). Every block must be resident at once, which `flush`
checks with the driver's occupancy; where it is not, or for a single product, the products go out as their own
kernels. One token's products and a step's rows' go out in launches of their own (another kernel each).

Each held product keeps its arrays (so CuPy's pool hands none of their memory to later work before the launch);
a product may depend on one earlier product only, and on whatever that one waited for, so a product whose
inputs come from two unrelated products, or whose epilogue would share the group counters with one it does not
wait for, flushes the chain first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

CHAIN_MAX = 8  # quant.cu's CHAIN_MAX: products a launch
# quant.cu's Epilogue, ChainOp and Chain, field for field (C alignment: align=True), and where each field comes
# from in gemv1mc's arguments (Product.args)
EPILOGUE = np.dtype(
    [("mode", "<i4"), ("act", "<i4"), *((n, "<u8") for n in ("x8", "cnt", "res", "w", "xnew", "ss", "pw", "ps"))]
    + [("eps", "<f4")],
    align=True,
)
_INTS = ("rows", "cols", "tpb", "type", "n_ss", "grid", "dep", "counted", "last_wait", "base")
OP = np.dtype(
    [*((n, "<u8") for n in ("W", "x8", "y", "nss")), ("ep", EPILOGUE), *((n, "<i4") for n in _INTS), ("eps", "<f4")]
    + [("y_stride", "<i8"), ("n_tok", "<i4"), ("sets", "<i4")],  # the n-token products' (gemvn_chainc)
    align=True,
)
CHAIN = np.dtype([("op", OP, (CHAIN_MAX,)), ("sync", "<u8"), ("n", "<i4")], align=True)
# gemv1mc's arguments in order (products.py _gemv1q), gemvnc1's (rows.gemvn), and which of them are the op's and
# its epilogue's (an argument a kernel lacks is 0 in the op)
ARGS: tuple[str, ...] = ("W", "x8", "y", "rows", "cols", "tpb", "nss", "n_ss", "eps", "mode", "act")
ARGS += ("ep_x8", "ep_cnt", "ep_res", "ep_w", "ep_xnew", "ep_ss", "ep_pw", "ep_ps", "ep_eps")
ARGS_N: tuple[str, ...] = ("W", "x8", "n_tok", "y", "y_stride", "rows", "cols", "tpb", "sets", "nss", "n_ss", "eps")
ARGS_N += ("mode", "act", "ep_x8", "ep_cnt", "ep_res", "ep_w", "ep_xnew", "ep_ss")
_AT = {name: i for i, name in enumerate(ARGS)}
_AT_N = {name: i for i, name in enumerate(ARGS_N)}
_OP_POINTERS = ("W", "x8", "y", "nss")
_EP_FIELDS = {"mode": "mode", "act": "act", "x8": "ep_x8", "cnt": "ep_cnt", "res": "ep_res", "w": "ep_w"}
_EP_FIELDS |= {"xnew": "ep_xnew", "ss": "ep_ss", "pw": "ep_pw", "ps": "ep_ps", "eps": "ep_eps"}


@dataclass(frozen=True)
class Product:
    """One gemv1mc launch, or (n_token) one gemvnc1 launch: its kernel and arguments (in that kernel's order) and
    shape."""

    kernel: Any  # the product's own Kernel (kernels.py), for a launch alone
    args: tuple
    qtype: int  # 12 (Q4_K) or 14 (Q6_K): gemv1_mma's and gemvn_mma's T
    grid: int
    threads: int
    smem: int
    n_token: bool = False

    def __post_init__(self) -> None:
        want = len(ARGS_N if self.n_token else ARGS)
        if len(self.args) != want:
            raise ValueError(f"{'gemvnc1' if self.n_token else 'gemv1mc'} takes {want} arguments, not {len(self.args)}")

    def arg(self, name: str) -> int | float:
        """An argument as the kernel takes it: an array's address (0: NULL), a number (0: one of the other kernel's
        that this one lacks)."""
        at, other = (_AT_N, _AT) if self.n_token else (_AT, _AT_N)
        if name not in at:
            if name not in other:
                raise KeyError(name)
            return 0
        a = self.args[at[name]]
        if isinstance(a, np.generic):
            return float(a) if isinstance(a, np.floating) else int(a)
        return int(a.data.ptr)

    @property
    def inputs(self) -> tuple[int, ...]:  # addresses of x8, the norm's sums and the epilogue's residual
        return tuple(int(p) for p in map(self.arg, ("x8", "nss", "ep_res")) if p)

    @property
    def outputs(self) -> tuple[int, ...]:  # addresses of y and the epilogue's x8, x_new and sums of squares
        return tuple(int(p) for p in map(self.arg, ("y", "ep_x8", "ep_xnew", "ep_ss")) if p)

    @property
    def has_epilogue(self) -> bool:
        return self.arg("mode") != 0


class Chain:
    """The products held for one launch (add, flush)."""

    def __init__(self, xp: Any, kernel: Callable[[bool], Any], n_sm: int) -> None:
        self._xp = xp
        self._kernel = kernel  # gemv1_chainc's Kernel, or (True: n tokens) gemvn_chainc's, built on first use
        self._n_sm = n_sm
        self._sync = xp.zeros(2 * CHAIN_MAX, dtype=xp.int32)
        self._held: list[Product] = []
        self._deps: list[int] = []
        self._fits: dict[tuple[bool, int, int], int] = {}  # (n_token, threads, smem) -> blocks an SM
        self._driver: Any = None

    def __len__(self) -> int:
        return len(self._held)

    def add(self, p: Product) -> None:
        """Hold p for the next launch, after the held products it reads from."""
        dep = self._dep(p)
        first = self._held[0] if self._held else p
        if dep is None or (p.threads, p.n_token) != (first.threads, first.n_token) or len(self._held) == CHAIN_MAX:
            self.flush()
            dep = -1
        self._held.append(p)
        self._deps.append(dep)

    def _dep(self, p: Product) -> int | None:
        """The held product p waits for (-1: none), or None where one is not enough."""
        made = {ptr: i for i, q in enumerate(self._held) for ptr in q.outputs}
        need = {made[ptr] for ptr in p.inputs if ptr in made}
        if p.has_epilogue:  # the epilogues' group counters are shared: after every held epilogue
            need |= {i for i, q in enumerate(self._held) if q.has_epilogue}
        dep = max(need, default=-1)
        return dep if need <= {dep, *self._ancestors(dep)} else None

    def _ancestors(self, i: int) -> set[int]:
        out: set[int] = set()
        while i >= 0 and self._deps[i] >= 0:
            i = self._deps[i]
            out.add(i)
        return out

    def clear(self) -> None:
        """Forget what is held (a step that failed: its products must not run after it)."""
        self._held, self._deps = [], []

    def flush(self) -> None:
        """Launch what is held: one gemv1_chainc where every block fits at once, else each product alone."""
        held, deps = self._held, self._deps
        if not held:
            return
        self._held, self._deps = [], []
        threads, smem, n_token = held[0].threads, max(p.smem for p in held), held[0].n_token
        width = self._n_sm * self._blocks_fit(n_token, threads, smem) if len(held) > 1 else 0
        if max(p.grid for p in held) > width:
            for p in held:
                p.kernel((p.grid,), (p.threads,), p.args, shared_mem=p.smem)
            return
        bases = self._bases(held, deps, width)
        grid = max(b + p.grid for b, p in zip(bases, held, strict=True))
        table = np.zeros((), dtype=CHAIN)
        for k, (p, dep) in enumerate(zip(held, deps, strict=True)):
            op = table["op"][k]
            for name in (*_OP_POINTERS, "rows", "cols", "tpb", "n_ss", "eps", "y_stride", "n_tok", "sets"):
                op[name] = p.arg(name)
            for field, name in _EP_FIELDS.items():
                op["ep"][field] = p.arg(name)
            op["type"], op["grid"], op["dep"], op["base"] = p.qtype, p.grid, dep, bases[k]
            op["counted"] = int(k in deps)
            op["last_wait"] = int(dep >= 0 and k == max(j for j, d in enumerate(deps) if d == dep))
        table["sync"], table["n"] = int(self._sync.data.ptr), len(held)
        self._launch(n_token, grid, threads, smem, table)

    def _bases(self, held: list[Product], deps: list[int], width: int) -> list[int]:
        """Each product's first block in a launch of at most `width` blocks: where a product does not read its
        predecessor's output (a layer's v beside its q/k: both read the down product's code) and both fit side by
        side, its blocks follow the predecessor's, so the two run at once rather than one after the other on the
        first blocks; else 0. Which blocks run a product changes no number (each runs the product's block)."""
        bases = [0] * len(held)
        for k in range(1, len(held)):
            after = bases[k - 1] + held[k - 1].grid
            if deps[k] != k - 1 and after + held[k].grid <= width:
                bases[k] = after
        return bases

    def _blocks_fit(self, n_token: bool, threads: int, smem: int) -> int:
        if (n_token, threads, smem) not in self._fits:
            kernel = self._kernel(n_token)
            kernel.allow_smem(smem)
            n = ctypes.c_int(0)
            status = self._cuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(n), kernel.raw.kernel.ptr, threads, smem
            )
            self._fits[(n_token, threads, smem)] = n.value if status == 0 else 0
        return self._fits[(n_token, threads, smem)]

    def _launch(self, n_token: bool, grid: int, threads: int, smem: int, table: np.ndarray) -> None:
        kernel = self._kernel(n_token)
        kernel.allow_smem(smem)
        params = ctypes.create_string_buffer(table.tobytes(), CHAIN.itemsize)
        args = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        stream = self._xp.cuda.get_current_stream().ptr
        status = self._cuda().cuLaunchKernel(kernel.raw.kernel.ptr, grid, 1, 1, threads, 1, 1, smem, stream, args, None)
        if status != 0:
            name = "gemvn_chainc" if n_token else "gemv1_chainc"
            raise RuntimeError(f"cuLaunchKernel of {name} failed: CUresult {status}")

    def _cuda(self) -> Any:
        if self._driver is None:
            cuda = ctypes.CDLL("libcuda.so.1")
            u, p = ctypes.c_uint, ctypes.c_void_p
            cuda.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
            cuda.cuLaunchKernel.restype = ctypes.c_int
            occupancy = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor
            occupancy.argtypes = [ctypes.POINTER(ctypes.c_int), p, ctypes.c_int, ctypes.c_size_t]
            occupancy.restype = ctypes.c_int
            self._driver = cuda
        return self._driver
