"""The hot operations the forward pass needs, one implementation per device.

Arrays are the backend's own (`numpy.ndarray`, `cupy.ndarray`); weights are opaque handles made by
`load_matrix`, so a backend chooses its representation: NumPy dequantizes to float32 because BLAS
is the only fast path on a CPU; the CuPy backend keeps GGUF block layout on the device and runs
quantized kernels. Shapes in the docstrings: n = tokens in the batch, H = query heads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from genie_common.gguf_file import TensorInfo

from ..batch import Batch
from ..host_copy import HostCopy
from ..kv_cache import KVCache, LayerKV
from ..memory_plan import available_ram
from ..model_config import LayerConfig, ModelConfig, RopeMode
from ..next_tokens import NextTokens

Array = Any
Weight = Any


@dataclass(frozen=True, eq=False)
class NextInput:
    """What the next operation does with a product's output: `gated_matmul(out, act, ...)` (act set; with `up`,
    `gated_matmul(out, act, ..., up=up)`: Gemma 4's per-layer input), `add_norm_matmul(residual, out, norm, eps,
    ...)` (norm set), or `add_normed_matmul(residual, out, post_norm, eps, scale, norm, ...)` (post_norm set; norm
    may be None). A hint that lets a device backend prepare that input as it writes the output (one pass less);
    results are the same with or without it. Where it did, the backend returns its own value in place of the output
    array (the CuPy backend's Coded), so the caller hands a hinted product's output, and an attention's output, on
    to that next operation as it got it, and reads nothing of it itself."""

    act: str | None = None
    residual: Array | None = None
    norm: Array | None = None
    eps: float = 0.0
    post_norm: Array | None = None
    scale: Array | None = None
    up: Array | None = None


class Backend(ABC):
    name: str
    xp: Any  # the array module

    @property
    def device_name(self) -> str:
        return self.name

    def unsupported(self, cfg: ModelConfig) -> str | None:
        """Why this backend cannot run a model of this config (checked before any weight is loaded), or None."""
        return None

    # -- weights --------------------------------------------------------------------------------
    @abstractmethod
    def load_matrix(self, tensor: TensorInfo) -> Weight:
        """A [out, in] weight, ready for `matmul` and `embed`."""

    @abstractmethod
    def load_vector(self, tensor: TensorInfo) -> Array:
        """A 1-D float32 parameter (norm weight, bias)."""

    @abstractmethod
    def group(self, weights: list[Weight]) -> Weight:
        """Matrices that share their input as one weight: `matmul` gives their outputs side by side."""

    # -- memory (memory_plan.py) --------------------------------------------------------------------
    def weight_bytes(self, tensors: list[TensorInfo], matrix: bool) -> int:
        """Bytes `load_matrix` (matrix) or `load_vector` and `group` will hold for these tensors (several: a
        group that shares its input), before any is loaded."""
        if not matrix:
            return sum(int(np.prod(t.shape)) for t in tensors) * 4
        return sum(t.n_bytes for t in tensors)

    def kv_zeros(self, shape: tuple[int, ...], dtype: Any) -> Array:
        """A zeroed KV pool array (kv_cache.py): memory the plan counts in full, of which a backend may hold
        only what is written."""
        return self.xp.zeros(shape, dtype=dtype)

    def release_memory(self) -> None:  # noqa: B027 (a hook: NumPy returns memory as it frees it)
        """Hands memory the backend caches but does not use back (after an allocation failed)."""

    def free_memory(self) -> int:
        """Bytes the backend can allocate now (the default memory budget's start)."""
        return available_ram()

    def scratch_bytes(self, cfg: ModelConfig, prefill_chunk: int, n_slots: int) -> tuple[int, int]:
        """(fixed bytes, bytes per context token) that one step's activations and buffers take at most: a
        prefill chunk's activations, each slot's logits; a backend adds its own buffers."""
        widest = max(
            (cfg.n_heads + 2 * lc.n_kv_heads) * max(lc.head_dim, lc.v_head_dim) + 3 * lc.ffn_dim for lc in cfg.layers
        )
        acts = prefill_chunk * (6 * cfg.d_model + widest) * 4 * 2  # a layer's arrays, and as many temporaries
        return acts + 2 * n_slots * cfg.n_vocab * 4, 0

    # -- steps ------------------------------------------------------------------------------------
    def reserve_steps(self, max_tokens: int, max_segments: int, n_ctx: int) -> None:  # noqa: B027 (a hook)
        """Called by each engine once: its steps run at most `max_tokens` rows of at most `max_segments`
        segments, at positions below `n_ctx`. A backend whose captured steps read buffers it would otherwise grow
        as larger steps come (every captured step then made anew, an eager pass and a capture each) sizes them
        now; growing stays possible past these bounds."""

    def stage_inputs(self, ids: np.ndarray, pos0: int, slot: int = 0) -> Array:
        """Called by the forward pass first: the token ids (and the first position and the K/V slot) where
        the backend's kernels read them; returns the ids for `embed`."""
        return ids

    def stage_batch(self, batch: Batch) -> Array:
        """Called by the forward pass first with the step's segments (batch.py): stages the token ids and
        positions as `stage_inputs` does (the first segment's position; `stage_segment` points at another's)
        and the rows' groups (`stage_rows`); returns the ids for `embed`."""
        self.stage_rows(batch.row_groups)
        return self.stage_inputs(batch.ids, batch.segments[0].pos0, batch.segments[0].slot)

    def stage_segment(self, i: int | None) -> None:  # noqa: B027 (a hook: most backends need nothing)
        """In a step of several segments, the per-segment operations that follow (prepare_qkv, kv_write,
        attention, self_attention) are segment i's: a backend whose kernels read the position from a staged
        buffer points them at segment i's (None: back to the step's own)."""

    def decode_steps_by_count(self, cfg: ModelConfig, kv: KVCache) -> bool:
        """Whether a step of several one-token segments computes the same whatever their slots are, reading
        rows, slots and positions from what stage_batch staged: then one captured step serves every set of
        that many streams (the engine keys it by the count), instead of one capture per set of slots."""
        return False

    def mixed_steps_by_shape(self, cfg: ModelConfig, kv: KVCache) -> bool:
        """Whether a step mixing prompt chunks (padded to step_buckets) with one-token segments computes the
        same whatever its segments' slots and positions are: then the engine captures one step per shape
        (the segments' sizes in order), as decode_steps_by_count lets it for decode steps."""
        return False

    def decode_attention(
        self,
        qkv: Array,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Array | None,
        kv: LayerKV,
        batch: Batch,
        shared: bool = False,
    ) -> Array | None:
        """In a step of several segments, self_attention (shared: shared_attention, qkv the queries alone) for
        every one-token segment at once: an array [n, H * hdv] whose rows of those segments are filled (the caller
        fills the others), or None where this backend runs them one by one (the default)."""
        return None

    def stage_rows(self, groups: tuple[int, ...]) -> None:  # noqa: B027 (a hook, as stage_segment)
        """The rows of the products that follow come in independent groups of these sizes (a segment's
        tokens; one row a sequence for the logits). A backend whose product gives a row other numbers when
        the row count changes computes each group as it would alone, so every sequence gets in a batch the
        numbers it gets alone; others may ignore it."""

    # requests served at once when the configuration does not say (EngineOptions.parallel 0): as many as run
    # together faster than one after the other
    default_parallel = 1

    # whether a forward pass may stop between layers when its request is cancelled: a backend that runs
    # each layer as it is called (NumPy, where a 256-token chunk takes 0.3-1 s on 2 cores); not one whose
    # passes may be captured and replayed whole (CUDA graphs), where a chunk takes milliseconds anyway
    stops_between_layers = False

    # whether forward_step captures the steps it is given and replays them (CUDA graphs on a GPU)
    captures_steps = False

    # whether a forward pass returns once launched, before the device has run it (a GPU): the scheduler then
    # launches each step before reading the tokens of the one before into text (Engine(launch_ahead=...))
    launches_ahead = False

    def forward_step(
        self,
        steps: dict[Hashable, Any],
        key: Hashable,
        run: Callable[[], Array],
        batch: Batch,
        capturable: bool,
    ) -> Array:
        """Runs `run` (one forward pass of `batch`). A backend may capture the pass once per `key` into `steps`
        (owned by the caller, whose KV cache and weights the capture reads) and replay it for later steps with
        other ids and positions (CUDA graphs); `capturable` says the pass reads its ids and positions only
        through `stage_batch` and is of a shape that repeats (decode steps, a full prefill chunk). A replayed
        step's output is valid until the next step runs (captured steps may share memory)."""
        return run()

    # -- compute ----------------------------------------------------------------------------------
    @abstractmethod
    def embed(self, weight: Weight, ids: Array, scale: float) -> Array:
        """Rows `ids` (from `stage_inputs`) of a [vocab, d] weight times `scale` -> [n, d] float32."""

    @abstractmethod
    def matmul(self, x: Array, weight: Weight, then: NextInput | None = None) -> Array:
        """x [n, in] @ weight.T -> [n, out]; `then`: how the output is used next (a hint)."""

    @abstractmethod
    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """RMSNorm over the last axis, times weight (broadcast from the right)."""

    # -- fused compositions: a backend may run each as fewer launches; these defaults define the result
    def add_rms_norm(self, x: Array, r: Array, weight: Array, eps: float) -> tuple[Array, Array]:
        """The residual add and the next RMSNorm: (x + r, rms_norm(x + r)); x may be updated in place."""
        x = x + r
        return x, self.rms_norm(x, weight, eps)

    def add_normed(self, x: Array, y: Array, weight: Array | None, eps: float, scale: Array | None = None) -> Array:
        """x + rms_norm(y) (y itself when weight is None), times `scale` [1] when given: a post-norm's residual add
        and the layer scale after it (Gemma 4)."""
        x = x + (y if weight is None else self.rms_norm(y, weight, eps))
        return x if scale is None else x * scale

    def add_norm_matmul(
        self, x: Array, r: Array | None, norm: Array, eps: float, w: Weight, then: NextInput | None = None
    ) -> tuple[Array, Array]:
        """(x + r, rms_norm(x + r) @ w.T): a layer's input add, norm and first product (no add when r is None)."""
        if r is None:
            return x, self.matmul(self.rms_norm(x, norm, eps), w, then)
        x, h = self.add_rms_norm(x, r, norm, eps)
        return x, self.matmul(h, w, then)

    def add_normed_matmul(
        self,
        x: Array,
        y: Array,
        y_norm: Array | None,
        eps: float,
        scale: Array | None,
        norm: Array | None,
        w: Weight,
        then: NextInput | None = None,
    ) -> tuple[Array, Array]:
        """(x', rms_norm(x') @ w.T) for x' = add_normed(x, y, y_norm, eps, scale), or x' @ w.T itself when norm is
        None: a post-norm's residual add (Gemma 3 and 4) and the product that reads the stream after it."""
        x = self.add_normed(x, y, y_norm, eps, scale)
        if norm is None:
            return x, self.matmul(x, w, then)
        return self.add_norm_matmul(x, None, norm, eps, w, then)

    def gated_matmul(
        self, gate_up: Array, kind: str, w: Weight, then: NextInput | None = None, up: Array | None = None
    ) -> Array:
        """gated_act(gate_up, kind) @ w.T: the FFN's activation and down projection; with `up`, gate_up is the
        gate alone and the input is gated_pair(gate_up, up, kind) (Gemma 4's per-layer input)."""
        if up is not None:
            return self.matmul(self.gated_pair(gate_up, up, kind), w, then)
        return self.matmul(self.gated_act(gate_up, kind), w, then)

    def prepare_qkv(
        self,
        qkv: Array,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Array | None,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Array:
        """From a layer's QKV product [n, (H + Hkv) * hd + Hkv * hdv] (the layer's dims): q and k normed (when
        the model has q/k norms, rows [H + Hkv, hd]) and rotated, v normed without a weight (cfg.v_norm), k
        and v stored at positions pos0.. of `slot`; returns q [n, H, hd]."""
        n, H, Hkv, hd, hdv = qkv.shape[0], cfg.n_heads, lc.n_kv_heads, lc.head_dim, lc.v_head_dim
        # q and k heads side by side, so the norm and RoPE run once for both: [n, H + Hkv, hd]
        qk = qkv[:, : (H + Hkv) * hd].reshape(n, H + Hkv, hd)
        v = qkv[:, (H + Hkv) * hd :].reshape(n, Hkv, hdv)
        if qk_norm is not None:
            qk = self.rms_norm(qk, qk_norm, cfg.rms_eps)
        qk = self.rope(qk, positions, lc.rope_base, lc.rope_scale, lc.rope_dim, cfg.rope_mode, lc.rope_freq_factors)
        if cfg.v_norm:
            v = self.rms_norm(v, self.xp.ones(hdv, dtype=np.float32), cfg.rms_eps)
        self.kv_write(kv, slot, pos0, qk[:, H:], v)
        return qk[:, :H]

    def self_attention(
        self,
        qkv: Array,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Array | None,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Array:
        """A layer's attention over its own K/V: prepare_qkv (storing this layer's k and v), then attention of
        its q -> [n, H * hdv]. A device backend may do both in one kernel."""
        q = self.prepare_qkv(qkv, cfg, lc, qk_norm, positions, kv, slot, pos0)
        return self.attention(q, kv, slot, pos0, lc.sliding_window, cfg.attn_scale, cfg.attn_logit_softcap)

    def shared_attention(
        self,
        q: Array,
        cfg: ModelConfig,
        lc: LayerConfig,
        q_norm: Array | None,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Array:
        """A layer's attention over an earlier layer's K/V, already written for these positions (its product is Q
        alone, [n, H * hd]): prepare_q, then attention -> [n, H * hdv]. A device backend may do both in one kernel."""
        q = self.prepare_q(q, cfg, lc, q_norm, positions)
        return self.attention(q, kv, slot, pos0, lc.sliding_window, cfg.attn_scale, cfg.attn_logit_softcap)

    def prepare_q(
        self, q: Array, cfg: ModelConfig, lc: LayerConfig, q_norm: Array | None, positions: np.ndarray
    ) -> Array:
        """A layer that reads an earlier layer's K/V (its product is Q alone, [n, H * hd]): q normed (rows
        [H, hd]) and rotated -> [n, H, hd]."""
        q = q.reshape(q.shape[0], cfg.n_heads, lc.head_dim)
        if q_norm is not None:
            q = self.rms_norm(q, q_norm, cfg.rms_eps)
        return self.rope(q, positions, lc.rope_base, lc.rope_scale, lc.rope_dim, cfg.rope_mode, lc.rope_freq_factors)

    @abstractmethod
    def rope(
        self,
        x: Array,
        positions: np.ndarray,
        base: float,
        scale: float,
        rope_dim: int,
        mode: RopeMode,
        freq_factors: tuple[float, ...] | None = None,
    ) -> Array:
        """Rotary embedding of x [n, heads, head_dim] at `positions` [n], each rotated pair's angle divided by
        its freq factor when given; use the returned array (in place where x allows it)."""

    @abstractmethod
    def gated_act(self, gate_up: Array, kind: str) -> Array:
        """act(gate) * up for gate_up = [gate | up] of shape [n, 2 * ffn]; act = silu | gelu_tanh."""

    def gated_pair(self, gate: Array, up: Array, kind: str) -> Array:
        """act(gate) * up for gate, up of shape [n, cols] (up may be a view with rows apart): gated_act of the
        two side by side."""
        return self.gated_act(self.xp.concatenate([gate, up], axis=-1), kind)

    @abstractmethod
    def kv_write(self, kv: LayerKV, slot: int, pos0: int, k: Array, v: Array) -> None:
        """Store k [n, Hkv, hd], v [n, Hkv, hdv] at positions pos0.. of `slot` (quantizing for INT8)."""

    @abstractmethod
    def attention(
        self, q: Array, kv: LayerKV, slot: int, pos0: int, window: int, scale: float, softcap: float
    ) -> Array:
        """Causal attention of q [n, H, hd] at positions pos0.. over keys [0, pos0 + n) of `slot`,
        keys further back than `window` (if non-zero) masked -> [n, H * hdv]."""

    @abstractmethod
    def softcap(self, x: Array, cap: float) -> Array:
        """cap * tanh(x / cap)."""

    def greedy_tokens(self, logits: Array, rows: list[int]) -> list[int]:
        """The index of the largest value in each of these rows of `logits` (the first of equals), or -1 for a row
        with a value that is not finite (a device backend: in one launch and one copy back)."""
        host = self.to_host(logits)
        return [int(np.argmax(host[r])) if np.isfinite(host[r]).all() else -1 for r in rows]

    def greedy_ahead(self, logits: Array, rows: list[int]) -> NextTokens:
        """greedy_tokens of these rows, left where `replay_ahead` reads them as the next step's ids: a device
        backend launches the argmax and queues the copy back, waiting for neither (next_tokens.py)."""
        return NextTokens(self.greedy_tokens(logits, rows))

    def replay_ahead(self, steps: dict[Hashable, Any], key: Hashable, batch: Batch, ahead: NextTokens) -> Array | None:
        """The captured step `key` replayed for `batch`, with no input from the host: `batch` is the decode step
        staged last (its one-token segments, each wanting logits, in the same order) one position on, and their
        ids are `ahead`'s tokens. Its logits, or None where the backend cannot (a host backend, no current
        captured step, another make-up): then nothing ran, and the caller runs the step once it has read the
        tokens."""
        return None

    def take_rows(self, x: Array, rows: np.ndarray) -> Array:
        """x[rows] for the rows of the step staged by `stage_batch` whose logits it returns (a backend that
        replays captured steps reads them from where it staged them)."""
        return x[self.xp.asarray(rows)]

    # sizes a prompt chunk is padded to, so that a chunk of any length replays a captured step (none: no
    # padding, every chunk runs as it is)
    step_buckets: tuple[int, ...] = ()

    def stack_rows(self, parts: list[Array]) -> Array:
        """The parts' rows one after the other, [sum of rows, ...]."""
        return self.xp.concatenate(parts)

    @abstractmethod
    def to_host(self, x: Array) -> np.ndarray:
        """A NumPy copy (or view) of a device array."""

    def start_to_host(self, x: Array) -> HostCopy:
        """`to_host(x)` without waiting for it: a device backend queues the copy behind the work before it
        (host_copy.py); here it is made at once."""
        return HostCopy(self.to_host(x))

    def gather_slot(self, arrays: list[Array], slot: int, n: int) -> Array:
        """Positions [0, n) of `slot` of each array ([slots, positions, ...] pools), as bytes one array after the
        other: a new flat uint8 array the pools can change under (a KV save)."""
        xp = self.xp
        if not arrays or n == 0:
            return xp.empty(0, dtype=xp.uint8)
        return xp.concatenate([xp.ascontiguousarray(a[slot, :n]).reshape(-1).view(xp.uint8) for a in arrays])
