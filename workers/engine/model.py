"""A loaded model: its config, tokenizer and weights on a backend, built from one GGUF file."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genie_common.errors import BackendUnsupportedError, ModelFileError
from genie_common.gguf_file import GGUFFile, TensorInfo

from .arch import ARCHITECTURES
from .arch.layers import LayerWeights, ModelWeights, expected_shapes
from .arch.spec import GLOBAL_TENSORS, KV_ROLES, LAYER_TENSORS, ArchSpec
from .backends.base import Backend
from .model_config import MetaReader, ModelConfig
from .tokenizer import Tokenizer

MATRIX_ROLES = frozenset(
    {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "embed", "output", "ple_embed", "ple_model_proj"}
    | {"ple_gate", "ple_proj"}
)


@dataclass(frozen=True)
class ModelHeader:
    """What the file's header says before any weight is loaded: enough to plan the memory (memory_plan.py)."""

    config: ModelConfig
    weight_bytes: int  # what the backend will hold for the weights, in its own form


@dataclass
class Model:
    path: Path
    name: str
    config: ModelConfig
    tokenizer: Tokenizer
    weights: ModelWeights
    chat_template: str | None
    file_size: int
    fingerprint: bytes  # GGUFFile.fingerprint(): saved KV is only ever hydrated into this exact model
    load_ms: float
    backend: Backend
    weight_bytes: int  # what `weights` holds, counted from the header before they were loaded

    @classmethod
    def load(
        cls, path: str | Path, backend: Backend, before_weights: Callable[[ModelHeader], None] | None = None
    ) -> Model:
        """`before_weights(header)` is called once the header is read and before any weight is allocated
        (the engine's memory plan, which may refuse the model)."""
        t0 = time.perf_counter()
        path = Path(path)
        with GGUFFile(path) as gf:
            arch = gf.architecture
            spec = ARCHITECTURES.get(arch)
            if spec is None:
                known = ", ".join(sorted(ARCHITECTURES))
                raise ModelFileError(path, f"unknown architecture {arch!r} (genie runs {known})")
            tokenizer = Tokenizer.from_metadata(gf.metadata, str(path))
            n_vocab = tokenizer.vocab.n_vocab
            config = spec.read_config(MetaReader(gf.metadata, arch, str(path), gf.tensors), n_vocab)
            reason = backend.unsupported(config)
            if reason is not None:
                raise BackendUnsupportedError(path, f"the {backend.name} backend does not run this model: {reason}")
            weight_bytes = _planned_weight_bytes(gf, config, spec, backend)
            if before_weights is not None:
                before_weights(ModelHeader(config, weight_bytes))
            weights = _load_weights(gf, config, spec, backend)
            name = str(gf.get("general.name") or path.stem)
            template = gf.get("tokenizer.chat_template")
            size = gf.file_size
            fingerprint = gf.fingerprint()
        return cls(
            path,
            name,
            config,
            tokenizer,
            weights,
            template if isinstance(template, str) else None,
            size,
            fingerprint,
            (time.perf_counter() - t0) * 1000,
            backend,
            weight_bytes,
        )


def _planned_weight_bytes(gf: GGUFFile, config: ModelConfig, spec: ArchSpec, backend: Backend) -> int:
    """The bytes the backend will hold for the weights (Backend.weight_bytes), from the header alone."""
    total = sum(backend.weight_bytes(group, matrix) for group, matrix in _weight_groups(gf, config, spec))
    for i, lc in enumerate(config.layers):  # q/k norms become rows [H (+ Hkv), hd] (_layer)
        if LAYER_TENSORS["q_norm"].format(i=i) in gf.tensors:
            total += (config.n_heads + (lc.n_kv_heads if lc.kv_source == i else 0)) * lc.head_dim * 4
    return total


def _weight_groups(gf: GGUFFile, cfg: ModelConfig, spec: ArchSpec) -> list[tuple[list[TensorInfo], bool]]:
    """The tensors load takes, as the groups it stacks (QKV, gate + up) and alone; and whether each is a matrix."""
    names = [GLOBAL_TENSORS[r] for r in ("embed", "output", "output_norm", *spec.global_roles)]
    out = [([gf.tensors[n]], _is_matrix(n)) for n in names if n in gf.tensors]
    for i, lc in enumerate(cfg.layers):
        owns_kv = lc.kv_source == i
        roles = [r for r in (*spec.layer_roles, *spec.optional_layer_roles) if owns_kv or r not in KV_ROLES]
        named = {r: LAYER_TENSORS[r].format(i=i) for r in roles}
        present = {r: gf.tensors[name] for r, name in named.items() if name in gf.tensors}
        for norm in ("q_norm", "k_norm"):  # counted as the rows they become (_planned_weight_bytes)
            present.pop(norm, None)
        for group in (("wq", "wk", "wv"), ("w_gate", "w_up")):
            parts = [present.pop(r) for r in group if r in present]
            if parts:
                out.append((parts, True))
        out += [([t], r in MATRIX_ROLES) for r, t in present.items()]
    return out


def _is_matrix(name: str) -> bool:
    return any(GLOBAL_TENSORS[r] == name for r in MATRIX_ROLES if r in GLOBAL_TENSORS)


def _load_weights(gf: GGUFFile, cfg: ModelConfig, spec: ArchSpec, backend: Backend) -> ModelWeights:
    global_shapes = expected_shapes(cfg, cfg.layers[0])

    def load(role: str, name: str, shapes: dict[str, tuple[int, ...]]) -> Any:
        info = gf.tensors.get(name)
        if info is None:
            raise ModelFileError(gf.path, f"missing tensor {name}")
        if info.shape != shapes[role]:
            raise ModelFileError(gf.path, f"tensor {name} has shape {info.shape}, expected {shapes[role]}")
        try:
            loaded = backend.load_matrix(info) if role in MATRIX_ROLES else backend.load_vector(info)
        except ValueError as e:  # the backend found the data itself unusable
            raise ModelFileError(gf.path, str(e)) from None
        gf.release(info)  # the file's pages of it leave the resident set: the load never holds the file whole
        return loaded

    embed = load("embed", GLOBAL_TENSORS["embed"], global_shapes)
    has_output = GLOBAL_TENSORS["output"] in gf.tensors
    output = load("output", GLOBAL_TENSORS["output"], global_shapes) if has_output else embed
    extra = {role: load(role, GLOBAL_TENSORS[role], global_shapes) for role in spec.global_roles}
    layers = []
    for i, lc in enumerate(cfg.layers):
        shapes = expected_shapes(cfg, lc)
        owns_kv = lc.kv_source == i  # a layer that shares K/V has (or uses) none of its own
        required = [r for r in spec.layer_roles if owns_kv or r not in KV_ROLES]
        optional = [r for r in spec.optional_layer_roles if owns_kv or r not in KV_ROLES]
        w = {role: load(role, LAYER_TENSORS[role].format(i=i), shapes) for role in required}
        w.update(
            (role, load(role, LAYER_TENSORS[role].format(i=i), shapes))
            for role in optional
            if LAYER_TENSORS[role].format(i=i) in gf.tensors
        )
        layers.append(_layer(gf.path, i, cfg, w, backend))
    output_norm = load("output_norm", GLOBAL_TENSORS["output_norm"], global_shapes)
    return ModelWeights(embed=embed, output_norm=output_norm, output=output, layers=layers, optional=extra)


def _layer(path: Path, i: int, cfg: ModelConfig, w: dict[str, Any], backend: Backend) -> LayerWeights:
    """Groups what the forward pass runs together: QKV and gate/up matrices, the biases, the q/k norms."""
    xp = backend.xp
    lc = cfg.layers[i]
    owns_kv = lc.kv_source == i
    opt: dict[str, Any] = {}
    biases = [w.get(b) for b in (("bq", "bk", "bv") if owns_kv else ("bq",))]
    if any(b is not None for b in biases):
        if any(b is None for b in biases):
            raise ModelFileError(path, f"layer {i} has some but not all of the Q/K/V biases")
        opt["bqkv"] = xp.concatenate(biases)
    if owns_kv and ("q_norm" in w) != ("k_norm" in w):
        raise ModelFileError(path, f"layer {i} has a norm for only one of Q and K")
    if "q_norm" in w:  # rows [H (+ Hkv), hd]: the q heads' norm, then the k heads' where the layer owns K/V
        rows = [xp.broadcast_to(w["q_norm"], (cfg.n_heads, lc.head_dim))]
        if owns_kv:
            rows.append(xp.broadcast_to(w["k_norm"], (lc.n_kv_heads, lc.head_dim)))
        opt["qk_norm"] = xp.concatenate(rows)
    for role in ("post_attn_norm", "post_ffn_norm", "ple_gate", "ple_proj", "ple_post_norm", "layer_scale"):
        if role in w:
            opt[role] = w[role]
    return LayerWeights(
        attn_norm=w["attn_norm"],
        qkv=backend.group([w["wq"], w["wk"], w["wv"]] if owns_kv else [w["wq"]]),
        wo=w["wo"],
        ffn_norm=w["ffn_norm"],
        gate_up=backend.group([w["w_gate"], w["w_up"]]),
        w_down=w["w_down"],
        optional=opt,
    )
