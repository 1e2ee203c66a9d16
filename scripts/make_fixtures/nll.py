"""Per-token NLL of llama.cpp on the committed English text, for tests/workers/engine/arch/test_numerics.py.

Dev-only: needs llama-cpp-python (`pip install llama-cpp-python`, ~5 min build); never run in CI.
Windows follow `genie perplexity`: with BOS, [BOS] + tokens[i : i + ctx - 1] with step ctx - 1;
without, tokens[i : i + ctx] with step ctx. F16 KV (type 1), so genie's --fp16-kv is comparable.

    python scripts/make_fixtures/nll.py            # writes testkit/fixtures/nll/<model>.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from genie_common.registry import resolve_model  # noqa: E402

TEXT = ROOT / "testkit/fixtures/text/apache-2.0.txt"
CTX = 512
GGML_TYPE_F16 = 1


def windows(tokens: list[int], bos: int | None, ctx: int) -> list[list[int]]:
    if bos is not None:
        out = [[bos, *tokens[i : i + ctx - 1]] for i in range(0, len(tokens), ctx - 1)]
    else:
        out = [tokens[i : i + ctx] for i in range(0, len(tokens), ctx)]
    return [w for w in out if len(w) >= 2]


def main() -> None:
    text = TEXT.read_text(encoding="utf-8")
    for name in ("gemma3-270m", "smollm2-135m"):
        llm = llama_cpp.Llama(
            model_path=str(resolve_model(name)),
            n_ctx=CTX,
            n_batch=CTX,
            logits_all=True,
            type_k=GGML_TYPE_F16,
            type_v=GGML_TYPE_F16,
            n_threads=2,
            verbose=False,
        )
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
        bos = llm.token_bos() if add_bos else None
        nll: list[float] = []
        for w in windows(tokens, bos, CTX):
            llm.reset()
            llm.eval(w)
            logits = np.asarray(llm.scores[: len(w)], dtype=np.float64)
            lse = logits.max(-1) + np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
            nll.extend((lse[:-1] - logits[np.arange(len(w) - 1), w[1:]]).tolist())
        out = {
            "model": name,
            "llama_cpp_python": llama_cpp.__version__,
            "ctx": CTX,
            "kv": "f16",
            "text": TEXT.name,
            "n_tokens": len(tokens),
            "add_bos": add_bos,
            "ppl": math.exp(sum(nll) / len(nll)),
            "nll": [round(x, 6) for x in nll],
        }
        path = ROOT / f"testkit/fixtures/nll/{name}.json"
        path.write_text(json.dumps(out) + "\n")
        print(f"{name}: {len(tokens)} tokens, {len(nll)} scored, ppl {out['ppl']:.4f} -> {path}")
        del llm


if __name__ == "__main__":
    main()
