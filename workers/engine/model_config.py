"""Typed hyper-parameters of a model, read from GGUF metadata by its architecture file."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np
from gguf import GGMLQuantizationType

from genie_common.errors import ModelFileError
from genie_common.gguf_file import TensorInfo

RopeMode = Literal["norm", "neox"]  # norm: rotate pairs (x[2i], x[2i+1]); neox: rotate halves
Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True)
class LayerConfig:
    """What may differ from one layer to the next. The shape fields left 0 (and kv_source left -1) take the
    model's values when the ModelConfig is built, so every layer of a ModelConfig has all of them."""

    rope_base: float
    rope_scale: float  # positions are multiplied by this (1 / linear scaling factor)
    sliding_window: int  # 0: global attention; else a key is visible iff q_pos - k_pos < window
    head_dim: int = 0  # of this layer's queries and keys
    v_head_dim: int = 0
    n_kv_heads: int = 0
    ffn_dim: int = 0
    rope_dim: int = 0  # leading dims of each head that are rotated
    # per rotated pair j: its angle is divided by this (llama.cpp's rope_freqs; 1e30 leaves the pair as is)
    rope_freq_factors: tuple[float, ...] | None = None
    kv_source: int = -1  # the layer whose K/V this one attends over: itself, or an earlier one it shares


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # of queries and keys
    v_head_dim: int
    ffn_dim: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_mode: RopeMode
    rope_dim: int  # leading dims of each head that are rotated
    activation: Activation
    attn_scale: float
    embed_scale: float
    final_logit_softcap: float  # 0: none
    attn_logit_softcap: float  # 0: none
    layers: tuple[LayerConfig, ...]
    v_norm: bool = False  # V rows RMS-normed (without a weight) before they are stored (Gemma 4)
    ple_dim: int = 0  # per-layer embedding width (Gemma 4's PLE); 0: none

    def __post_init__(self) -> None:
        if len(self.layers) != self.n_layers:
            raise ValueError(f"{len(self.layers)} layer configs for {self.n_layers} layers")
        full = tuple(
            replace(
                lc,
                head_dim=lc.head_dim or self.head_dim,
                v_head_dim=lc.v_head_dim or self.v_head_dim,
                n_kv_heads=lc.n_kv_heads or self.n_kv_heads,
                ffn_dim=lc.ffn_dim or self.ffn_dim,
                rope_dim=lc.rope_dim or self.rope_dim,
                kv_source=i if lc.kv_source < 0 else lc.kv_source,
            )
            for i, lc in enumerate(self.layers)
        )
        object.__setattr__(self, "layers", full)  # frozen: set once, here

    @cached_property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers that write K/V, in order: each has a pool in the KV cache."""
        return tuple(i for i, lc in enumerate(self.layers) if lc.kv_source == i)

    @cached_property
    def kv_pools(self) -> tuple[int, ...]:
        """Per layer, the KV cache pool it reads (and, if it owns one, writes)."""
        return tuple(self.kv_layers.index(lc.kv_source) for lc in self.layers)

    @property
    def uniform(self) -> bool:
        """Every layer has the model's head dims, KV heads, FFN width and RoPE dims and its own K/V, and the
        model has no PLE or V norm (a model of one layer shape throughout)."""
        return (
            not self.v_norm
            and not self.ple_dim
            and all(
                (lc.head_dim, lc.v_head_dim, lc.n_kv_heads, lc.ffn_dim, lc.rope_dim, lc.kv_source)
                == (self.head_dim, self.v_head_dim, self.n_kv_heads, self.ffn_dim, self.rope_dim, i)
                and lc.rope_freq_factors is None
                for i, lc in enumerate(self.layers)
            )
        )


class MetaReader:
    """`{arch}.*` metadata with typed access; a missing required key is a ModelFileError. `tensors` (the
    file's tensor table) serves the hyper-parameters a converter stores as tensors (Gemma 4's rope_freqs)."""

    def __init__(
        self, meta: dict[str, Any], arch: str, path: str, tensors: Mapping[str, TensorInfo] | None = None
    ) -> None:
        self.meta, self.arch, self.path = meta, arch, path
        self.tensors: Mapping[str, TensorInfo] = tensors or {}

    def _number(self, key: str, default: Any, kind: type) -> Any:
        full = f"{self.arch}.{key}"
        value = self.meta.get(full, default)
        if value is None:
            raise ModelFileError(self.path, f"metadata has no {full}")
        if isinstance(value, (str, bool)) or (isinstance(value, (list, np.ndarray)) and len(value) == 0):
            raise ModelFileError(self.path, f"{full} = {value!r} is not a number")
        if isinstance(value, (list, np.ndarray)):  # per-layer arrays: genie needs them uniform
            if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
                raise ModelFileError(self.path, f"{full} is not a number or an array of numbers")
            values = {float(v) for v in value.ravel()}
            if len(values) != 1:
                raise ModelFileError(self.path, f"{full} differs between layers ({sorted(values)})")
            value = values.pop()
        return self._checked(full, value, kind)

    def _checked(self, full: str, value: Any, kind: type) -> Any:
        if isinstance(value, (str, bool, np.bool_)):
            raise ModelFileError(self.path, f"{full} = {value!r} is not a number")
        number = float(value)
        if not math.isfinite(number) or number < 0 or (kind is int and number != int(number)):
            raise ModelFileError(self.path, f"{full} = {value!r} is not a valid {kind.__name__}")
        return kind(number)

    def get_int(self, key: str, default: int | None = None) -> int:
        """A non-negative integer; a uniform per-layer array counts as its one value."""
        return int(self._number(key, default, int))

    def get_float(self, key: str, default: float | None = None) -> float:
        """A finite, non-negative number."""
        return float(self._number(key, default, float))

    def get_ints(self, key: str, n: int, default: int | None = None) -> tuple[int, ...]:
        """A non-negative integer per layer: an array of n, or one value for every layer."""
        full = f"{self.arch}.{key}"
        value = self.meta.get(full)
        if not isinstance(value, (list, np.ndarray)):
            return (self.get_int(key, default),) * n
        if len(value) != n:
            raise ModelFileError(self.path, f"{full} has {len(value)} values for {n} layers")
        return tuple(self._checked(full, v, int) for v in np.asarray(value).ravel())

    def get_flags(self, key: str, n: int) -> tuple[bool, ...]:
        """A boolean per layer (an array of n); a missing key is a ModelFileError."""
        full = f"{self.arch}.{key}"
        value = self.meta.get(full)
        if value is None:
            raise ModelFileError(self.path, f"metadata has no {full}")
        arr = np.asarray(value)
        if arr.ndim != 1 or len(arr) != n or arr.dtype.kind not in "bui":
            raise ModelFileError(self.path, f"{full} is not {n} booleans")
        return tuple(bool(v) for v in arr)

    def f32_tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A small F32 tensor of the file that holds hyper-parameters, checked for its shape and finite."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelFileError(self.path, f"missing tensor {name}")
        if info.qtype != GGMLQuantizationType.F32 or info.shape != shape:
            raise ModelFileError(self.path, f"tensor {name} is {info.qtype.name} {info.shape}, expected F32 {shape}")
        values = np.array(info.data.view(np.float32).reshape(shape))
        if not np.isfinite(values).all():
            raise ModelFileError(self.path, f"tensor {name} holds non-finite values")
        return values

    def rope_scale(self) -> float:
        kind = self.meta.get(f"{self.arch}.rope.scaling.type", "none")
        if kind in ("none", None):
            return 1.0
        if kind != "linear":
            raise ModelFileError(self.path, f"unsupported RoPE scaling {kind!r} (genie supports linear)")
        factor = self.get_float("rope.scaling.factor", 1.0)
        return 1.0 / factor if factor > 0 else 1.0


# Bounds no real model comes near; they stop a corrupt header from allocating per-layer state for
# billions of layers or dividing by a zero head size.
MAX_LAYERS = 1024
MAX_DIM = 1 << 20


def _dim(r: MetaReader, key: str, default: int | None = None, limit: int = MAX_DIM) -> int:
    value = r.get_int(key, default)
    if not 1 <= value <= limit:
        raise ModelFileError(r.path, f"{r.arch}.{key} = {value} is outside [1, {limit}]")
    return value


def base_config(r: MetaReader, n_vocab: int, **overrides: Any) -> ModelConfig:
    """The fields every supported architecture reads the same way; the arch file overrides the rest (an
    overridden field is not read: Gemma 4 gives per-layer arrays where the others give one value)."""

    def field(name: str, read: Callable[[], Any]) -> Any:
        return overrides[name] if name in overrides else read()

    n_heads = _dim(r, "attention.head_count")
    d_model = _dim(r, "embedding_length")
    n_kv_heads = field("n_kv_heads", lambda: _dim(r, "attention.head_count_kv", n_heads))
    if n_heads % n_kv_heads:
        raise ModelFileError(r.path, f"{n_heads} heads cannot share {n_kv_heads} KV heads")
    head_dim = field("head_dim", lambda: _dim(r, "attention.key_length", max(d_model // n_heads, 1)))
    n_layers = _dim(r, "block_count", limit=MAX_LAYERS)
    fields: dict[str, Any] = dict(
        arch=r.arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        v_head_dim=field("v_head_dim", lambda: _dim(r, "attention.value_length", head_dim)),
        ffn_dim=field("ffn_dim", lambda: _dim(r, "feed_forward_length")),
        n_vocab=n_vocab,
        n_ctx_train=_dim(r, "context_length", limit=1 << 24),
        rms_eps=r.get_float("attention.layer_norm_rms_epsilon"),
        rope_mode="neox",
        rope_dim=field("rope_dim", lambda: r.get_int("rope.dimension_count", head_dim)),
        activation="silu",
        attn_scale=1.0 / math.sqrt(head_dim),
        embed_scale=1.0,
        final_logit_softcap=r.get_float("final_logit_softcapping", 0.0),
        attn_logit_softcap=r.get_float("attn_logit_softcapping", 0.0),
        layers=field(
            "layers",
            lambda: tuple(
                LayerConfig(r.get_float("rope.freq_base", 10000.0), r.rope_scale(), 0) for _ in range(n_layers)
            ),
        ),
    )
    fields.update(overrides)
    cfg = ModelConfig(**fields)
    for i, lc in enumerate(cfg.layers):
        if lc.rope_dim > lc.head_dim or lc.rope_dim % 2:
            raise ModelFileError(r.path, f"layer {i}: {lc.rope_dim} RoPE dims do not fit head_dim {lc.head_dim}")
        if cfg.n_heads % lc.n_kv_heads:
            raise ModelFileError(r.path, f"layer {i}: {cfg.n_heads} heads cannot share {lc.n_kv_heads} KV heads")
    return cfg
