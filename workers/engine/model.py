"""A loaded model: its config, tokenizer and weights on a backend, built from one GGUF file."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .arch import ARCHITECTURES
from .arch.layers import LayerWeights, ModelWeights, expected_shapes
from .arch.spec import GLOBAL_TENSORS, LAYER_TENSORS
from .backends.base import Backend
from .errors import ModelFileError
from .gguf_file import GGUFFile, TensorInfo
from .model_config import MetaReader, ModelConfig
from .tokenizer import Tokenizer

MATRIX_ROLES = frozenset({"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "embed", "output"})


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

    @classmethod
    def load(cls, path: str | Path, backend: Backend) -> Model:
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
            config = spec.read_config(MetaReader(gf.metadata, arch, str(path)), n_vocab)
            weights = _load_weights(gf, config, spec.layer_roles, spec.optional_layer_roles, backend)
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
        )


def _load_weights(
    gf: GGUFFile, cfg: ModelConfig, required: tuple[str, ...], optional: tuple[str, ...], backend: Backend
) -> ModelWeights:
    shapes = expected_shapes(cfg)

    def tensor(role: str, name: str) -> TensorInfo:
        info = gf.tensors.get(name)
        if info is None:
            raise ModelFileError(gf.path, f"missing tensor {name}")
        if info.shape != shapes[role]:
            raise ModelFileError(gf.path, f"tensor {name} has shape {info.shape}, expected {shapes[role]}")
        return info

    def load(role: str, name: str) -> Any:
        info = tensor(role, name)
        try:
            return backend.load_matrix(info) if role in MATRIX_ROLES else backend.load_vector(info)
        except ValueError as e:  # the backend found the data itself unusable
            raise ModelFileError(gf.path, str(e)) from None

    embed = load("embed", GLOBAL_TENSORS["embed"])
    output = load("output", GLOBAL_TENSORS["output"]) if GLOBAL_TENSORS["output"] in gf.tensors else embed
    layers = []
    for i in range(cfg.n_layers):
        w = {role: load(role, LAYER_TENSORS[role].format(i=i)) for role in required}
        w.update(
            (role, load(role, LAYER_TENSORS[role].format(i=i)))
            for role in optional
            if LAYER_TENSORS[role].format(i=i) in gf.tensors
        )
        layers.append(_layer(gf.path, i, cfg, w, backend))
    output_norm = load("output_norm", GLOBAL_TENSORS["output_norm"])
    return ModelWeights(embed=embed, output_norm=output_norm, output=output, layers=layers)


def _layer(path: Path, i: int, cfg: ModelConfig, w: dict[str, Any], backend: Backend) -> LayerWeights:
    """Groups what the forward pass runs together: QKV and gate/up matrices, the biases, the q/k norms."""
    xp = backend.xp
    opt: dict[str, Any] = {}
    biases = [w.get(b) for b in ("bq", "bk", "bv")]
    if any(b is not None for b in biases):
        if any(b is None for b in biases):
            raise ModelFileError(path, f"layer {i} has some but not all of the Q/K/V biases")
        opt["bqkv"] = xp.concatenate(biases)
    if ("q_norm" in w) != ("k_norm" in w):
        raise ModelFileError(path, f"layer {i} has a norm for only one of Q and K")
    if "q_norm" in w:
        opt["qk_norm"] = xp.concatenate(
            [
                xp.broadcast_to(w["q_norm"], (cfg.n_heads, cfg.head_dim)),
                xp.broadcast_to(w["k_norm"], (cfg.n_kv_heads, cfg.head_dim)),
            ]
        )
    for role in ("post_attn_norm", "post_ffn_norm"):
        if role in w:
            opt[role] = w[role]
    return LayerWeights(
        attn_norm=w["attn_norm"],
        qkv=backend.group([w["wq"], w["wk"], w["wv"]]),
        wo=w["wo"],
        ffn_norm=w["ffn_norm"],
        gate_up=backend.group([w["w_gate"], w["w_up"]]),
        w_down=w["w_down"],
        optional=opt,
    )
