"""The hot operations the forward pass needs, one implementation per device.

Arrays are the backend's own (`numpy.ndarray`, `cupy.ndarray`); weights are opaque handles made by
`load_matrix`, so a backend chooses its representation: NumPy dequantizes to float32 because BLAS
is the only fast path on a CPU; the CuPy backend keeps GGUF block layout on the device and runs
quantized kernels. Shapes in the docstrings: n = tokens in the batch, H = query heads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ..gguf_file import TensorInfo
from ..kv_cache import LayerKV
from ..model_config import RopeMode

Array = Any
Weight = Any


class Backend(ABC):
    name: str
    xp: Any  # the array module

    @property
    def device_name(self) -> str:
        return self.name

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

    # -- steps ------------------------------------------------------------------------------------
    def stage_inputs(self, ids: np.ndarray, pos0: int) -> Array:
        """Called by the forward pass first: the token ids (and the first position) where the backend's
        kernels read them; returns the ids for `embed`."""
        return ids

    def forward_step(
        self,
        steps: dict[Hashable, Any],
        key: Hashable,
        run: Callable[[], Array],
        ids: np.ndarray,
        pos0: int,
        capturable: bool,
    ) -> Array:
        """Runs `run` (one forward pass of `ids` at `pos0`). A backend may capture the pass once per `key`
        into `steps` (owned by the caller, whose KV cache and weights the capture reads) and replay it for
        later steps with other ids and positions (CUDA graphs); `capturable` says the pass reads its
        position only through `stage_inputs`."""
        return run()

    # -- compute ----------------------------------------------------------------------------------
    @abstractmethod
    def embed(self, weight: Weight, ids: Array, scale: float) -> Array:
        """Rows `ids` (from `stage_inputs`) of a [vocab, d] weight times `scale` -> [n, d] float32."""

    @abstractmethod
    def matmul(self, x: Array, weight: Weight) -> Array:
        """x [n, in] @ weight.T -> [n, out]."""

    @abstractmethod
    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """RMSNorm over the last axis, times weight (broadcast from the right)."""

    def add_rms_norm(self, x: Array, r: Array, weight: Array, eps: float) -> tuple[Array, Array]:
        """The residual add and the next RMSNorm: (x + r, rms_norm(x + r)); x may be updated in place."""
        x = x + r
        return x, self.rms_norm(x, weight, eps)

    @abstractmethod
    def rope(self, x: Array, positions: np.ndarray, base: float, scale: float, rope_dim: int, mode: RopeMode) -> Array:
        """Rotary embedding of x [n, heads, head_dim] at `positions` [n]; use the returned array (in place
        where x allows it)."""

    @abstractmethod
    def gated_act(self, gate_up: Array, kind: str) -> Array:
        """act(gate) * up for gate_up = [gate | up] of shape [n, 2 * ffn]; act = silu | gelu_tanh."""

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

    @abstractmethod
    def to_host(self, x: Array) -> np.ndarray:
        """A NumPy copy (or view) of a device array."""
