"""The fused decode step on the GPU: one token through the whole model in one cooperative launch.

`FusedDecode` owns, for one KV slot, what kernels/decode.cu reads: the model's descriptors (weights, norms,
this slot's KV pools, RoPE tables) packed with numpy into the C structs' layout, the activation buffers,
and the barrier and argmax counters. `unsupported` says why a model cannot take this path (the backend then
runs its separate kernels, captured as a CUDA graph). The module is compiled per model shape (head group,
head dim, the longest product input, the weight types present); CuPy caches it on disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..arch.layers import ModelWeights
from ..kv_cache import KVCache
from ..model_config import ModelConfig

if TYPE_CHECKING:
    from .cupy_backend import CupyBackend, GroupWeight, QuantWeight

MAX_SPLITS = 32  # DK_MAX_SPLITS
MAX_COLS = 24_576  # the longest product input the shared-memory buffers are sized for here
MAX_HEAD_GROUP_DIMS = 32  # G * head_dim / 32: gqa_attend's accumulators per lane

# the C structs of decode.cu, field for field (every field 8 bytes: no padding)
MAT = np.dtype([("w", "u8"), ("row_bytes", "i8"), ("qtype", "i8"), ("rows", "i8"), ("cols", "i8")])
_PTR = "u8"
LAYER = np.dtype(
    [("qkv", MAT, (3,)), ("n_qkv", "i8"), ("o", MAT), ("gate", MAT), ("up", MAT), ("down", MAT)]
    + [(name, _PTR) for name in ("attn_norm", "ffn_norm", "qk_norm", "bqkv", "post_attn_norm", "post_ffn_norm")]
    + [(name, _PTR) for name in ("k", "v", "k_scale", "v_scale", "cos_t", "sin_t")]
    + [("window", "i8")]
)
_STEP_INTS = ("n_layers", "d", "n_heads", "n_kv", "ffn", "rope_dim", "neox", "act", "max_splits", "blk")
_STEP_FLOATS = ("eps", "embed_scale", "attn_scale", "attn_softcap", "final_softcap")
_STEP_BUFFERS = ("x0", "x1", "qkv", "attn", "o", "h", "p", "logits", "part_m", "part_l", "part_acc", "att_done", "bar")
_STEP_ARGMAX = ("am_v", "am_i", "am_bad", "am_done", "token")
STEP = np.dtype(
    [("layers", _PTR)]
    + [(name, "i8") for name in _STEP_INTS]
    + [("embed", MAT), ("output", MAT), ("out_norm", _PTR)]
    + [(name, "f8") for name in _STEP_FLOATS]
    + [("ids", _PTR), ("pos", _PTR)]
    + [(name, _PTR) for name in _STEP_BUFFERS + _STEP_ARGMAX]
    + [("marks", _PTR), ("n_marks", "i8")]
)
MARKS_PER_LAYER = 15  # decode.cu: phase boundaries per layer (then 2 for the output layer)


# the kernels' activation codes (`gated` in kernels/common.cuh)
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def unsupported(cfg: ModelConfig, kv: KVCache) -> str | None:
    """Why the fused step cannot run this model with this cache, or None when it can."""
    if kv.config.dtype not in ("int8", "f16"):
        return f"{kv.config.dtype} KV"
    if not cfg.uniform:  # one head dim, KV-head count and FFN width for every layer, each its own K/V
        return "layers of different shapes, shared K/V, per-layer embeddings or RoPE frequency factors"
    hd, group = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    if cfg.v_head_dim != hd or hd % 32:
        return f"head dims {hd}/{cfg.v_head_dim} (needs equal multiples of 32)"
    if group * hd // 32 > MAX_HEAD_GROUP_DIMS or group > 8:
        return f"{group} query heads of {hd} per KV head"
    if _max_cols(cfg) > MAX_COLS:
        return f"product inputs of {_max_cols(cfg)} values"
    return None


def _max_cols(cfg: ModelConfig) -> int:
    return max(cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.ffn_dim)


def _parts(w: QuantWeight | GroupWeight) -> list[QuantWeight]:
    return list(getattr(w, "parts", [w]))


def _mat(w: QuantWeight, row0: int = 0, rows: int | None = None) -> tuple[int, int, int, int, int]:
    """A Mat for rows [row0, row0 + rows) of w."""
    n = w.rows - row0 if rows is None else rows
    return (w.data.data.ptr + row0 * w.row_bytes, w.row_bytes, int(w.qtype), n, w.cols)


def _ptr(a: Any) -> int:
    return 0 if a is None else int(a.data.ptr)


class FusedDecode:
    """One slot's decode step as one launch of decode_step; `run` returns the [1, vocab] logits."""

    def __init__(self, backend: CupyBackend, cfg: ModelConfig, weights: ModelWeights, kv: KVCache, slot: int) -> None:
        import cupy as cp

        self.backend, self.cfg, self.weights, self.kv, self.slot = backend, cfg, weights, kv, slot
        types = {p.qtype for lw in weights.layers for w in (lw.qkv, lw.wo, lw.gate_up, lw.w_down) for p in _parts(w)}
        types |= {weights.embed.qtype, weights.output.qtype}
        defines = {
            "DK_G": cfg.n_heads // cfg.n_kv_heads,
            "DK_DPL": cfg.head_dim // 32,
            "DK_MAXC": -(-_max_cols(cfg) // 32) * 32,
            "DK_D": cfg.d_model,
            "DK_TYPES": sum(1 << int(t) for t in types),
            "DK_KV": {"int8": 1, "f16": 2}[kv.config.dtype],  # KV_INT8, KV_F16 of attend.cuh
            "DK_PREFETCH": int(backend.fused_prefetch),
            "DK_THREADS": backend.fused_threads,
            "DK_UNITS": backend.fused_units,
        }
        self.threads = backend.fused_threads
        module = backend.decode_module(tuple(sorted(defines.items())))
        sizes = cp.ndarray((3,), cp.int64, module.get_global("dk_sizes")).get()
        if tuple(int(v) for v in sizes) != (MAT.itemsize, LAYER.itemsize, STEP.itemsize):
            raise RuntimeError(f"decode.cu struct sizes {tuple(sizes)} differ from cupy_decode.py's")
        self._smem = int(cp.ndarray((1,), cp.int32, module.get_global("dk_smem_bytes")).get()[0])
        self._kernel = module.get_function("decode_step")
        if self._kernel.max_dynamic_shared_size_bytes < self._smem:
            self._kernel.max_dynamic_shared_size_bytes = self._smem
        from cupy_backends.cuda.api import driver

        self._driver = driver
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(self._kernel.kernel.ptr, self.threads, self._smem)
        if per_sm < 1:
            raise RuntimeError(f"decode_step does not fit on an SM ({self._smem} bytes of shared memory)")
        self.grid = backend.n_sm  # one block per SM: all resident (the launch is cooperative)

        f32 = cp.float32
        H, hd, n_kv = cfg.n_heads, cfg.head_dim, cfg.n_kv_heads
        n_qkv = (H + 2 * n_kv) * hd
        self.buffers = {
            "x0": cp.zeros(cfg.d_model, f32),
            "x1": cp.zeros(cfg.d_model, f32),
            "qkv": cp.zeros(n_qkv, f32),
            "attn": cp.zeros(H * hd, f32),
            "o": cp.zeros(cfg.d_model, f32),
            "h": cp.zeros(cfg.ffn_dim, f32),
            "p": cp.zeros(cfg.d_model, f32),
            "logits": cp.zeros((1, weights.output.rows), f32),
            "part_m": cp.zeros(H * MAX_SPLITS, f32),
            "part_l": cp.zeros(H * MAX_SPLITS, f32),
            "part_acc": cp.zeros(H * MAX_SPLITS * hd, f32),
            "att_done": cp.zeros(n_kv, cp.int32),  # counters: zero between launches (the kernel resets them)
            "bar": cp.zeros(96, cp.uint32),  # grid_sync: count, generation, exits on lines of their own
            "am_v": cp.zeros(self.grid, f32),
            "am_i": cp.zeros(self.grid, cp.int32),
            "am_bad": cp.zeros(self.grid, cp.int32),
            "am_done": cp.zeros(1, cp.int32),
            "token": cp.zeros(1, cp.int32),
        }
        self.marks: Any = None  # [grid, n_marks + ...] clock64 phase boundaries, when profiling (record_marks)
        self._version = -1
        self._pack()

    def record_marks(self, on: bool) -> None:
        """Have each launch record every block's clock at each phase boundary (bench/gpu_phases.py)."""
        import cupy as cp

        n = MARKS_PER_LAYER * self.cfg.n_layers + 2
        self.marks = cp.zeros(self.grid * n + 2, cp.int64) if on else None
        self._version = -1  # repack

    def _pack(self) -> None:
        """Writes the descriptors (again when the backend replaced a buffer they point to)."""
        import cupy as cp

        cfg, w, kv, slot, b = self.cfg, self.weights, self.kv, self.slot, self.backend
        tables = {
            (lc.rope_base, lc.rope_scale): b.rope_table(lc.rope_base, lc.rope_scale, cfg.rope_dim, kv.config.n_ctx)
            for lc in cfg.layers
        }
        layers = np.zeros(cfg.n_layers, dtype=LAYER)
        for i, (lw, lc) in enumerate(zip(w.layers, cfg.layers, strict=True)):
            parts = _parts(lw.qkv)
            for j, p in enumerate(parts):
                layers["qkv"][i, j] = _mat(p)
            layers["n_qkv"][i] = len(parts)
            layers["o"][i], layers["down"][i] = _mat(lw.wo), _mat(lw.w_down)
            gu = _parts(lw.gate_up)
            if len(gu) == 1:  # gate and up merged into one matrix: its two halves
                layers["gate"][i], layers["up"][i] = _mat(gu[0], 0, cfg.ffn_dim), _mat(gu[0], cfg.ffn_dim, cfg.ffn_dim)
            else:
                layers["gate"][i], layers["up"][i] = _mat(gu[0]), _mat(gu[1])
            layers["attn_norm"][i], layers["ffn_norm"][i] = _ptr(lw.attn_norm), _ptr(lw.ffn_norm)
            for name in ("qk_norm", "bqkv", "post_attn_norm", "post_ffn_norm"):
                layers[name][i] = _ptr(lw.optional.get(name))
            lkv = kv.layers[i]
            layers["k"][i], layers["v"][i] = _ptr(lkv.k[slot]), _ptr(lkv.v[slot])
            layers["k_scale"][i] = _ptr(None if lkv.k_scale is None else lkv.k_scale[slot])
            layers["v_scale"][i] = _ptr(None if lkv.v_scale is None else lkv.v_scale[slot])
            table = tables[lc.rope_base, lc.rope_scale]
            layers["cos_t"][i], layers["sin_t"][i] = _ptr(table.cos), _ptr(table.sin)
            layers["window"][i] = lc.sliding_window
        self._layers = cp.asarray(layers.view(np.uint8))
        step = np.zeros(1, dtype=STEP)
        step["layers"] = self._layers.data.ptr
        values = dict(
            n_layers=cfg.n_layers,
            d=cfg.d_model,
            n_heads=cfg.n_heads,
            n_kv=cfg.n_kv_heads,
            ffn=cfg.ffn_dim,
            rope_dim=cfg.rope_dim,
            neox=int(cfg.rope_mode == "neox"),
            act=ACTIVATIONS[cfg.activation],
            max_splits=max(1, min(MAX_SPLITS, self.grid // cfg.n_kv_heads)),
            blk=cfg.head_dim & -cfg.head_dim,
            eps=cfg.rms_eps,
            embed_scale=cfg.embed_scale,
            attn_scale=cfg.attn_scale,
            attn_softcap=cfg.attn_logit_softcap,
            final_softcap=cfg.final_logit_softcap,
        )
        for name, value in values.items():
            step[name] = value
        step["embed"], step["output"] = _mat(w.embed), _mat(w.output)
        step["out_norm"] = _ptr(w.output_norm)
        ids, pos = b.staged_inputs()
        step["ids"], step["pos"] = _ptr(ids), _ptr(pos)
        for name, buf in self.buffers.items():
            step[name] = _ptr(buf)
        step["marks"], step["n_marks"] = _ptr(self.marks), MARKS_PER_LAYER * cfg.n_layers + 2
        self._step = cp.asarray(step.view(np.uint8))
        # the kernel's one argument: a pointer to the Step (kernelParams: an array of pointers to arguments)
        self._arg = np.array([self._step.data.ptr], dtype=np.uint64)
        self._params = np.array([self._arg.ctypes.data], dtype=np.uint64)
        self._version = b.buffer_version

    def run(self, token: int, pos0: int) -> Any:
        import cupy as cp

        b = self.backend
        b.stage_inputs(np.array([token], dtype=np.int64), pos0)
        if self._version != b.buffer_version:
            self._pack()
        self._driver.launchCooperativeKernel(
            self._kernel.kernel.ptr,
            self.grid,
            1,
            1,
            self.threads,
            1,
            1,
            self._smem,
            cp.cuda.get_current_stream().ptr,
            self._params.ctypes.data,
        )
        return self.buffers["logits"]

    @property
    def token(self) -> Any:
        """The argmax of the last run's logits (-1: a non-finite logit), on the device."""
        return self.buffers["token"]
