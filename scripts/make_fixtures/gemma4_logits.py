"""Golden logits for the tiny Gemma 4 of testkit/tiny_models.py from two independent implementations on the
same weights: transformers' `gemma4` (float32, eager attention) and llama.cpp (llama-cpp-python, CPU, F32
KV cache, no flash attention), the latter twice: as released, and built with its FP16 GELU table off.

llama.cpp's CPU backend evaluates GELU through a table indexed by the FP16 value of x (`#define
GGML_GELU_FP16` in ggml/src/ggml-cpu/vec.h), which moves this model's logits by up to ~5e-3 (~4e-2 with
q/k norm weights of 1); with the define removed it computes the formula, and the comparison is down to
summation order. That second build:

  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
  sed -i 's|^#define GGML_GELU_FP16$|// exact GELU|' llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/src/ggml-cpu/vec.h
  pip install --no-deps --target /tmp/llama_exact ./llama_cpp_python-0.3.36

Dev-only: needs torch, transformers (with gemma4) and llama-cpp-python; never run in CI. Writes
testkit/fixtures/tiny/gemma4.npz: `ids` [n] int32 (a prompt longer than the sliding window of 4),
`hf_logits`, `llama_logits` and `llama_exact_logits` [n, vocab] float32 (every position). The model itself
is not stored: tests rebuild it byte for byte from the seed (write_tiny_gemma4(seed=0)).

Usage, from the repository root:  python3 scripts/make_fixtures/gemma4_logits.py [--exact-llama /tmp/llama_exact]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "make_fixtures"))

from tiny_logits import IDS, llama_cpp_logits  # noqa: E402

from testkit.tiny_models import BOS_ID, EOS_ID, gemma4_tensors, write_tiny_gemma4  # noqa: E402

OUT = ROOT / "testkit" / "fixtures" / "tiny" / "gemma4.npz"

# GGUF tensor name -> transformers' Gemma4ForCausalLM parameter (bench/NOTES-gemma4.md §2.2)
GLOBALS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
    "output_norm.weight": "model.norm.weight",
}
PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "inp_gate.weight": "per_layer_input_gate.weight",
    "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight",
    "layer_output_scale.weight": "layer_scalar",
}


def hf_logits(hp: dict, tensors: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=hp["n_vocab"],
        hidden_size=hp["d_model"],
        intermediate_size=hp["ffn_dim"],
        num_hidden_layers=hp["n_layers"],
        num_attention_heads=hp["n_heads"],
        num_key_value_heads=hp["n_kv_heads"],
        head_dim=hp["head_dim"],
        global_head_dim=hp["global_head_dim"],
        max_position_embeddings=hp["context_length"],
        rms_norm_eps=hp["rms_eps"],
        sliding_window=hp["sliding_window"],
        layer_types=["sliding_attention" if s else "full_attention" for s in hp["sliding"]],
        final_logit_softcapping=hp["softcap"],
        vocab_size_per_layer_input=hp["n_vocab"],
        hidden_size_per_layer_input=hp["ple_dim"],
        num_kv_shared_layers=hp["n_shared"],
        use_double_wide_mlp=True,
        tie_word_embeddings=True,
        attention_k_eq_v=False,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": hp["rope_base_swa"]},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": hp["partial_rotary"],
                "rope_theta": hp["rope_base"],
            },
        },
        pad_token_id=0,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        attn_implementation="eager",
    )
    model = Gemma4ForCausalLM(config).eval()
    state = {}
    for name, array in tensors.items():
        if name == "rope_freqs.weight":  # llama.cpp's encoding of the proportional RoPE: HF computes it
            continue
        if name in GLOBALS:
            key = GLOBALS[name]
        else:
            _, i, rest = name.split(".", 2)
            key = f"model.layers.{i}.{PER_LAYER[rest]}"
        state[key] = torch.from_numpy(array.copy())
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    assert not missing and not unexpected, (missing, unexpected)
    with torch.no_grad():
        out = model(torch.from_numpy(ids.astype(np.int64))[None], use_cache=False).logits[0]
    return out.float().numpy()


def exact_llama_logits(site: Path, model: Path, ids: np.ndarray, out: Path) -> np.ndarray:
    """llama_cpp_logits in a process whose llama_cpp is the build in `site` (the FP16 GELU table off)."""
    code = (
        f"import sys; sys.path[:0] = [{str(site)!r}, {str(Path(__file__).parent)!r}, {str(ROOT / 'tests')!r}]; "
        "import numpy as np; from tiny_logits import llama_cpp_logits; "
        f"np.save({str(out)!r}, llama_cpp_logits(__import__('pathlib').Path({str(model)!r}), np.load({str(out)!r})))"
    )
    np.save(out, ids)
    subprocess.run([sys.executable, "-c", code], check=True)
    return np.load(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exact-llama", type=Path, default=Path("/tmp/llama_exact"), help="site dir of that build")
    args = p.parse_args()
    hp, tensors = gemma4_tensors(seed=0)
    ids = IDS  # 30 tokens > the window of 4
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gemma4.gguf"
        write_tiny_gemma4(path, seed=0)
        llama = llama_cpp_logits(path, ids)
        exact = exact_llama_logits(args.exact_llama, path, ids, Path(tmp) / "exact.npy")
    hf = hf_logits(hp, tensors, ids)
    for name, other in (("llama.cpp", llama), ("llama.cpp, exact GELU", exact)):
        d, top1 = np.abs(hf - other), np.mean(hf.argmax(-1) == other.argmax(-1))
        print(f"transformers vs {name}: max |d| {d.max():.2e}, argmax agreement {top1:.2f}")
    print(f"max |logit| {np.abs(hf).max():.2f}")
    np.savez_compressed(
        OUT,
        ids=ids,
        hf_logits=hf.astype(np.float32),
        llama_logits=llama.astype(np.float32),
        llama_exact_logits=exact.astype(np.float32),
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
