"""Tiny random GGUF models of each architecture genie runs, for logit tests against llama.cpp.

`write_tiny_model(arch, path, seed)` writes an F32 model with random weights and a small SentencePiece
(`llama`) vocabulary that llama.cpp loads. The bytes depend only on (arch, seed, overrides): the
golden logits in testkit/fixtures/tiny/ were made from these files by
scripts/make_fixtures/tiny_logits.py, so changing anything here invalidates them (rerun the script).

Every arch uses GQA; qwen3 and gemma3 have head_dim != d_model / n_heads; gemma3 has 7 layers
(layer 5 global, the others sliding) and a window shorter than the fixture prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

N_NORMAL_TOKENS = 125  # vocab = 3 special + 256 bytes + 125 normal = 384
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0

_COMMON: dict[str, Any] = dict(
    n_layers=2,
    d_model=64,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    ffn_dim=128,
    context_length=512,
    rms_eps=1e-5,
    rope_base=10000.0,
    tied=False,
)
ARCH_PARAMS: dict[str, dict[str, Any]] = {
    "llama": dict(_COMMON),
    "qwen2": dict(_COMMON, rms_eps=1e-6, rope_base=1_000_000.0, tied=True),
    "qwen3": dict(_COMMON, head_dim=32, rms_eps=1e-6, rope_base=1_000_000.0),
    "gemma3": dict(_COMMON, n_layers=7, head_dim=32, rms_eps=1e-6, rope_base=1_000_000.0, tied=True, sliding_window=8),
}
# The source of the Q4_K_M fixture: every matrix row (input dim) a multiple of the 256-wide K-quant block.
QUANT_SOURCE = dict(arch="llama", seed=1, d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512)


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    normal = ["\u2581" + c for c in letters] + [a + b for a in letters[:8] for b in letters]
    normal = normal[:N_NORMAL_TOKENS]
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    scores = [0.0] * 259 + [-float(i + 1) for i in range(len(normal))]
    return tokens, scores, [int(t) for t in types]


def _add_vocab(w: gguf.GGUFWriter) -> None:
    """The SentencePiece (`llama`) vocabulary every tiny model carries."""
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def write_tiny_model(arch: str, path: str | Path, seed: int = 0, **overrides: Any) -> dict[str, Any]:
    """Write a tiny F32 GGUF of `arch` to `path` (with `chat_template=...` among `overrides`, carrying that
    template); returns its hyper-parameters."""
    if arch not in ARCH_PARAMS:
        raise ValueError(f"unknown arch {arch!r}")
    hp = dict(ARCH_PARAMS[arch], **overrides)
    tokens, _, _ = _vocab()
    hp.update(arch=arch, seed=seed, n_vocab=len(tokens))
    d, H, Hkv, hd, ff = hp["d_model"], hp["n_heads"], hp["n_kv_heads"], hp["head_dim"], hp["ffn_dim"]
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:  # llama.cpp multiplies by the stored weight (gemma3: +1 folded in)
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    def vec(n: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(n) * scale).astype(np.float32)

    name = hp.get("arch_name", arch)  # another architecture's name on this one's tensors (a new family)
    w = gguf.GGUFWriter(str(path), name)
    w.add_name(f"tiny-{name}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(hp["context_length"])
    w.add_embedding_length(d)
    w.add_block_count(hp["n_layers"])
    w.add_feed_forward_length(ff)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(hp["rms_eps"])
    w.add_rope_freq_base(hp["rope_base"])
    if hd != d // H:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if "sliding_window" in hp:
        w.add_sliding_window(hp["sliding_window"])
    _add_vocab(w)
    if hp.get("chat_template"):
        w.add_chat_template(hp["chat_template"])

    w.add_tensor("token_embd.weight", mat(hp["n_vocab"], d, 0.1 if arch == "gemma3" else 0.2))
    for i in range(hp["n_layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(d))
        w.add_tensor(p + "attn_q.weight", mat(H * hd, d, 0.15))
        w.add_tensor(p + "attn_k.weight", mat(Hkv * hd, d, 0.15))
        w.add_tensor(p + "attn_v.weight", mat(Hkv * hd, d))
        if arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", vec(H * hd))
            w.add_tensor(p + "attn_k.bias", vec(Hkv * hd))
            w.add_tensor(p + "attn_v.bias", vec(Hkv * hd))
        if arch in ("qwen3", "gemma3"):
            w.add_tensor(p + "attn_q_norm.weight", norm(hd))
            w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        w.add_tensor(p + "attn_output.weight", mat(d, H * hd))
        if arch == "gemma3":
            w.add_tensor(p + "post_attention_norm.weight", norm(d))
        w.add_tensor(p + "ffn_norm.weight", norm(d))
        w.add_tensor(p + "ffn_gate.weight", mat(ff, d))
        w.add_tensor(p + "ffn_up.weight", mat(ff, d))
        w.add_tensor(p + "ffn_down.weight", mat(d, ff))
        if arch == "gemma3":
            w.add_tensor(p + "post_ffw_norm.weight", norm(d))
    w.add_tensor("output_norm.weight", norm(d))
    if not hp["tied"]:
        w.add_tensor("output.weight", mat(hp["n_vocab"], d))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hp


# A tiny Gemma 4 (bench/NOTES-gemma4.md §3): 8 layers, sliding except 3 and 7 (window 4), sliding head dim 32 and
# global 64, the last 4 layers sharing K/V (layer 3's for global, 2's for sliding: llama.cpp's and
# transformers' rule agree), FFN 128 and twice that in the shared layers, per-layer embeddings of width 16,
# global RoPE over a quarter of its dims (rope_freqs), a distinct scale per layer, softcap 30, tied output.
GEMMA4_PARAMS: dict[str, Any] = dict(
    n_layers=8,
    d_model=64,
    n_heads=2,
    n_kv_heads=1,
    head_dim=32,
    global_head_dim=64,
    ffn_dim=128,
    sliding=(True, True, True, False, True, True, True, False),
    sliding_window=4,
    n_shared=4,
    ple_dim=16,
    partial_rotary=0.25,
    rope_base=1_000_000.0,
    rope_base_swa=10_000.0,
    rms_eps=1e-6,
    softcap=30.0,
    context_length=512,
    scale=0.08,  # of the random matrices
    # q/k norm weights about this: Gemma 4 scores attention with scale 1 after the norms, so scores have a
    # standard deviation of about this² sqrt(hd), ~1 here as in trained models. Weights of ~1 (scores of
    # deviation sqrt(hd)) made a softmax so peaky that llama.cpp's FP16 GELU table moved logits by 3.9e-2
    # and TF32 GEMMs moved NLL by 0.05 (bench/NOTES.md)
    qk_norm_scale=0.35,
)


def gemma4_tensors(seed: int, **overrides: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The tiny Gemma 4's hyper-parameters and its float32 tensors by GGUF name (the fixture script feeds
    the same arrays to transformers)."""
    hp = dict(GEMMA4_PARAMS, **overrides)
    tokens, _, _ = _vocab()
    hp.update(arch="gemma4", seed=seed, n_vocab=len(tokens))
    rng = np.random.default_rng(seed)
    L, d, H, Hkv, P, V = hp["n_layers"], hp["d_model"], hp["n_heads"], hp["n_kv_heads"], hp["ple_dim"], hp["n_vocab"]
    first_shared = L - hp["n_shared"]

    def mat(rows: int, cols: int, scale: float = hp["scale"]) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:  # Gemma 4 multiplies by the stored weight as is (no "+1")
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    rotated = int(hp["partial_rotary"] * hp["global_head_dim"] / 2)
    t: dict[str, np.ndarray] = {
        "token_embd.weight": mat(V, d, 0.1),
        "per_layer_token_embd.weight": mat(V, L * P, 0.1),
        "per_layer_model_proj.weight": mat(L * P, d, 0.1),
        "per_layer_proj_norm.weight": norm(P),
        "rope_freqs.weight": np.array([1.0] * rotated + [1e30] * (hp["global_head_dim"] // 2 - rotated), np.float32),
        "output_norm.weight": norm(d),
    }
    for i in range(L):
        p, hd = f"blk.{i}.", hp["head_dim"] if hp["sliding"][i] else hp["global_head_dim"]
        ffn = hp["ffn_dim"] * (2 if i >= first_shared else 1)
        t[p + "attn_norm.weight"] = norm(d)
        t[p + "attn_q.weight"] = mat(H * hd, d)
        t[p + "attn_q_norm.weight"] = norm(hd) * np.float32(hp["qk_norm_scale"])
        if i < first_shared:  # the shared layers have no K/V of their own
            t[p + "attn_k.weight"] = mat(Hkv * hd, d)
            t[p + "attn_v.weight"] = mat(Hkv * hd, d)
            t[p + "attn_k_norm.weight"] = norm(hd) * np.float32(hp["qk_norm_scale"])
        t[p + "attn_output.weight"] = mat(d, H * hd)
        t[p + "post_attention_norm.weight"] = norm(d)
        t[p + "ffn_norm.weight"] = norm(d)
        t[p + "ffn_gate.weight"] = mat(ffn, d)
        t[p + "ffn_up.weight"] = mat(ffn, d)
        t[p + "ffn_down.weight"] = mat(d, ffn)
        t[p + "post_ffw_norm.weight"] = norm(d)
        t[p + "inp_gate.weight"] = mat(P, d)
        t[p + "proj.weight"] = mat(d, P)
        t[p + "post_norm.weight"] = norm(d)
        t[p + "layer_output_scale.weight"] = np.array([0.5 + 0.1 * i], np.float32)
    return hp, t


def write_tiny_gemma4(path: str | Path, seed: int = 0, **overrides: Any) -> dict[str, Any]:
    """Write the tiny Gemma 4 (F32) to `path`, with the keys llama.cpp's converter writes; returns its
    hyper-parameters."""
    hp, tensors = gemma4_tensors(seed, **overrides)
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name("tiny-gemma4")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_gemma4_keys(w, hp)
    _add_vocab(w)
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hp


def add_gemma4_keys(w: gguf.GGUFWriter, hp: dict[str, Any]) -> None:
    """The hyper-parameter keys llama.cpp's converter writes for Gemma 4, from GEMMA4_PARAMS-style `hp`
    (bench/synthetic.py writes its E2B-shaped model with them too)."""
    L, first_shared = hp["n_layers"], hp["n_layers"] - hp["n_shared"]
    w.add_context_length(hp["context_length"])
    w.add_embedding_length(hp["d_model"])
    w.add_block_count(L)
    w.add_feed_forward_length([hp["ffn_dim"] * (2 if i >= first_shared else 1) for i in range(L)])
    w.add_head_count(hp["n_heads"])
    w.add_head_count_kv(hp["n_kv_heads"])
    w.add_key_length(hp["global_head_dim"])
    w.add_value_length(hp["global_head_dim"])
    w.add_key_length_swa(hp["head_dim"])
    w.add_value_length_swa(hp["head_dim"])
    w.add_rope_dimension_count(hp["global_head_dim"])
    w.add_rope_dimension_count_swa(hp["head_dim"])
    w.add_rope_freq_base(hp["rope_base"])
    w.add_rope_freq_base_swa(hp["rope_base_swa"])
    w.add_sliding_window(hp["sliding_window"])
    w.add_sliding_window_pattern(list(hp["sliding"]))
    w.add_shared_kv_layers(hp["n_shared"])
    w.add_embedding_length_per_layer_input(hp["ple_dim"])
    w.add_layer_norm_rms_eps(hp["rms_eps"])
    w.add_final_logit_softcapping(hp["softcap"])
