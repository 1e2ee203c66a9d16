"""`gemma4` (Gemma 4 text, E2B and its kind), as llama.cpp's converter writes it (bench/NOTES-gemma4.md).

Per layer, from the metadata: sliding or global (`sliding_window_pattern`), head dims (`key_length` for
global layers, `key_length_swa` for sliding ones), KV heads and FFN width (a value or an array), RoPE
(global: base `rope.freq_base` over `rope.dimension_count` dims, with the `rope_freqs` tensor's frequency
factors, which leave all but the first pairs unrotated: HF's "proportional" RoPE; sliding: base
`rope.freq_base_swa` over `rope.dimension_count_swa`). The last `shared_kv_layers` layers write no K/V
and read the last earlier layer of their kind. What llama.cpp hard-codes, so do we: attention scale 1,
embeddings times sqrt(d_model), GELU-tanh, V rows RMS-normed without a weight; norm weights are used as
stored (no Gemma "+1"). Per-layer embeddings (PLE) and each layer's output scale come as tensors.
"""

import math

from genie_common.errors import ModelFileError

from ..model_config import LayerConfig, MetaReader, ModelConfig, base_config
from .spec import BASE_LAYER_ROLES, ArchSpec


def kv_sources(sliding: tuple[bool, ...], n_shared: int, path: str) -> tuple[int, ...]:
    """Per layer, the layer whose K/V it reads: itself below the shared ones; for a shared layer the last
    layer of its kind below them (transformers' rule). llama.cpp takes, fixed, the second-to-last such layer
    for sliding and the last for global ones and refuses files where that differs: so do we."""
    n = len(sliding)
    first = n - n_shared
    if not 0 <= n_shared < n:
        raise ModelFileError(path, f"{n_shared} KV-sharing layers of {n}")
    sources = list(range(n))
    for i in range(first, n):
        own_kind = [j for j in range(first) if sliding[j] == sliding[i]]
        if not own_kind:
            raise ModelFileError(path, f"layer {i} shares K/V, but no earlier layer is of its kind")
        sources[i] = own_kind[-1]
        if sources[i] != (first - 2 if sliding[i] else first - 1):
            raise ModelFileError(
                path, f"layer {i} would share layer {sources[i]}'s K/V: llama.cpp's rule reads another one"
            )
    return tuple(sources)


def read_config(r: MetaReader, n_vocab: int) -> ModelConfig:
    n_layers = r.get_int("block_count")
    sliding = r.get_flags("attention.sliding_window_pattern", n_layers)
    window = r.get_int("attention.sliding_window")
    hd_global, hd_sliding = r.get_int("attention.key_length"), r.get_int("attention.key_length_swa")
    if (r.get_int("attention.value_length", hd_global), r.get_int("attention.value_length_swa", hd_sliding)) != (
        hd_global,
        hd_sliding,
    ):
        raise ModelFileError(r.path, "V head dims differ from K head dims")
    rope_global = r.get_int("rope.dimension_count", hd_global)
    rope_sliding = r.get_int("rope.dimension_count_swa", hd_sliding)
    factors = tuple(float(f) for f in r.f32_tensor("rope_freqs.weight", (rope_global // 2,)))
    base_global = r.get_float("rope.freq_base", 1_000_000.0)
    base_sliding = r.get_float("rope.freq_base_swa", 10_000.0)
    n_kv = r.get_ints("attention.head_count_kv", n_layers)
    ffn = r.get_ints("feed_forward_length", n_layers)
    sources = kv_sources(sliding, r.get_int("attention.shared_kv_layers", 0), r.path)
    scale = r.rope_scale()
    layers = tuple(
        LayerConfig(
            base_sliding if sliding[i] else base_global,
            scale,
            window if sliding[i] else 0,
            head_dim=hd_sliding if sliding[i] else hd_global,
            v_head_dim=hd_sliding if sliding[i] else hd_global,
            n_kv_heads=n_kv[i],
            ffn_dim=ffn[i],
            rope_dim=rope_sliding if sliding[i] else rope_global,
            rope_freq_factors=None if sliding[i] else factors,
            kv_source=sources[i],
        )
        for i in range(n_layers)
    )
    d_model = r.get_int("embedding_length")
    ple_dim = r.get_int("embedding_length_per_layer_input")
    if ple_dim < 1:
        raise ModelFileError(r.path, "gemma4 without per-layer embeddings (embedding_length_per_layer_input 0)")
    return base_config(
        r,
        n_vocab,
        # model-wide values where the layers differ: the largest (each layer's own are in its LayerConfig)
        n_kv_heads=max(n_kv),
        head_dim=max(hd_global, hd_sliding),
        v_head_dim=max(hd_global, hd_sliding),
        ffn_dim=max(ffn),
        rope_dim=max(rope_global, rope_sliding),
        layers=layers,
        rope_mode="neox",
        activation="gelu_tanh",
        embed_scale=math.sqrt(d_model),
        attn_scale=1.0,
        v_norm=True,
        ple_dim=ple_dim,
    )


SPEC = ArchSpec(
    name="gemma4",
    read_config=read_config,
    layer_roles=BASE_LAYER_ROLES
    + ("q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")
    + ("ple_gate", "ple_proj", "ple_post_norm"),
    optional_layer_roles=("layer_scale",),
    global_roles=("ple_embed", "ple_model_proj", "ple_proj_norm"),
)
