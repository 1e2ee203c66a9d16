"""Typed hyper-parameters of a model, read from GGUF metadata by its architecture file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .errors import ModelFileError

RopeMode = Literal["norm", "neox"]  # norm: rotate pairs (x[2i], x[2i+1]); neox: rotate halves
Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True)
class LayerConfig:
    """What may differ from one layer to the next."""

    rope_base: float
    rope_scale: float  # positions are multiplied by this (1 / linear scaling factor)
    sliding_window: int  # 0: global attention; else a key is visible iff q_pos - k_pos < window


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


class MetaReader:
    """`{arch}.*` metadata with typed access; a missing required key is a ModelFileError."""

    def __init__(self, meta: dict[str, Any], arch: str, path: str) -> None:
        self.meta, self.arch, self.path = meta, arch, path

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.meta

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
    """The fields every supported architecture reads the same way; the arch file overrides the rest."""
    n_heads = _dim(r, "attention.head_count")
    d_model = _dim(r, "embedding_length")
    n_kv_heads = _dim(r, "attention.head_count_kv", n_heads)
    if n_heads % n_kv_heads:
        raise ModelFileError(r.path, f"{n_heads} heads cannot share {n_kv_heads} KV heads")
    head_dim = _dim(r, "attention.key_length", max(d_model // n_heads, 1))
    n_layers = _dim(r, "block_count", limit=MAX_LAYERS)
    fields: dict[str, Any] = dict(
        arch=r.arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        v_head_dim=_dim(r, "attention.value_length", head_dim),
        ffn_dim=_dim(r, "feed_forward_length"),
        n_vocab=n_vocab,
        n_ctx_train=_dim(r, "context_length", limit=1 << 24),
        rms_eps=r.get_float("attention.layer_norm_rms_epsilon"),
        rope_mode="neox",
        rope_dim=r.get_int("rope.dimension_count", head_dim),
        activation="silu",
        attn_scale=1.0 / math.sqrt(head_dim),
        embed_scale=1.0,
        final_logit_softcap=r.get_float("final_logit_softcapping", 0.0),
        attn_logit_softcap=r.get_float("attn_logit_softcapping", 0.0),
        layers=tuple(LayerConfig(r.get_float("rope.freq_base", 10000.0), r.rope_scale(), 0) for _ in range(n_layers)),
    )
    fields.update(overrides)
    cfg = ModelConfig(**fields)
    if cfg.rope_dim > cfg.head_dim or cfg.rope_dim % 2:
        raise ModelFileError(r.path, f"rope.dimension_count {cfg.rope_dim} does not fit head_dim {cfg.head_dim}")
    return cfg
