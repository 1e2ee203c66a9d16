"""The memory plan (issue 18): what the weights will take is known from the header, exactly as loaded; the
context follows the budget (auto) or is refused when it does not fit; a budget below the weights is one
line and exit 2, before anything loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from genie_common.engine_options import EngineOptions
from genie_common.registry import resolve_model
from genie_workers.engine.backends.block_weight import BlockWeight
from genie_workers.engine.backends.numpy_backend import NumpyBackend
from genie_workers.engine.engine import Engine
from genie_workers.engine.memory_plan import CTX_STEP, GIB, MIB, BudgetError, plan_memory
from genie_workers.engine.model import Model
from testkit.tiny_models import write_tiny_gemma4, write_tiny_model
from tests.child_env import child_env
from tests.workers.test_cli import assert_one_line_error

ROOT = Path(__file__).parents[3]
Q4_K_M = ROOT / "testkit/fixtures/tiny/llama-q4_k_m.gguf"


def held_bytes(weights) -> int:  # type: ignore[no-untyped-def]
    """Every array the loaded weights hold, each once (a tied output is the embedding)."""
    seen: dict[int, int] = {}

    def add(x) -> None:  # type: ignore[no-untyped-def]
        if isinstance(x, BlockWeight):
            for a in (x.q, x.scale, x.offset):
                add(a)
        elif isinstance(x, np.ndarray):
            base = x if x.base is None else x.base
            seen[id(base)] = base.nbytes

    for x in (weights.embed, weights.output, weights.output_norm, *weights.optional.values()):
        add(x)
    for layer in weights.layers:
        for x in (layer.attn_norm, layer.qkv, layer.wo, layer.ffn_norm, layer.gate_up, layer.w_down):
            add(x)
        for x in layer.optional.values():
            add(x)
    return sum(seen.values())


@pytest.mark.parametrize("kernels", [True, False], ids=["int8-blocks", "float32"])
@pytest.mark.parametrize("arch", ["q4_k_m", "gemma3", "qwen2", "gemma4", "smollm2-135m"])
def test_the_header_says_what_the_weights_take(tmp_path: Path, arch: str, kernels: bool) -> None:
    """The plan against what the load holds, to the byte: the tiny models of each architecture, and SmolLM2's Q4_1
    (float16 block scales, stacked and alone)."""
    path = Q4_K_M if arch == "q4_k_m" else tmp_path / f"{arch}.gguf"
    if arch == "smollm2-135m":
        path = resolve_model(arch, progress=lambda _: None)
    elif arch == "gemma4":
        write_tiny_gemma4(path)
    elif arch != "q4_k_m":
        write_tiny_model(arch, path)
    backend = NumpyBackend(block_kernels=kernels)
    seen = []
    model = Model.load(path, backend, seen.append)  # the header, before any weight is loaded
    planned, loaded = seen[0].weight_bytes, held_bytes(model.weights)
    assert planned == model.weight_bytes
    # the q/k norm rows are broadcast views of the file's vectors (no bytes of their own) and a group's
    # parts are freed once stacked: planned and held agree to the byte
    assert planned == loaded, (planned, loaded)


def test_auto_takes_the_training_context_when_it_fits_else_the_most_that_does() -> None:
    args = dict(weights=GIB, kv_per_token=MIB // 8, scratch_per_token=0, scratch=0, n_ctx_train=32768, n_slots=1)
    plan = plan_memory(**args, budget=8 * GIB, ctx=0)
    assert plan.n_ctx == 32768 and plan.total <= plan.budget
    plan = plan_memory(**args, budget=2 * GIB, ctx=0)  # 1 GiB of room: 8192 tokens of 128 KiB
    assert plan.n_ctx == 8192 and plan.n_ctx % CTX_STEP == 0
    plan = plan_memory(**{**args, "n_slots": 4}, budget=2 * GIB, ctx=0)
    assert plan.n_ctx == 2048 and plan.kv == GIB
    assert "weights 1.00 GiB + KV 1.00 GiB (ctx 2048 x 4)" in plan.line() and "of 2.00 budget" in plan.line()


def test_a_context_or_budget_that_does_not_fit_is_refused() -> None:
    args = dict(weights=GIB, kv_per_token=MIB // 8, scratch_per_token=0, scratch=0, n_ctx_train=32768, n_slots=1)
    with pytest.raises(BudgetError, match="a context of 16384 tokens x 1 slots does not fit.*8192 tokens would"):
        plan_memory(**args, budget=2 * GIB, ctx=16384)
    with pytest.raises(BudgetError, match="cannot hold the model: weights 1.00 GiB"):
        plan_memory(**args, budget=GIB, ctx=0)
    assert plan_memory(**args, budget=8 * GIB, ctx=100_000).n_ctx == 32768  # no more than the model was trained for


def test_engine_sizes_its_context_from_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)  # trained for 512 tokens
    roomy = Engine(EngineOptions(model=str(path), backend="numpy", parallel=1))
    assert roomy.n_ctx == 512 and roomy.plan.n_ctx == 512
    p = roomy.plan
    room_for_300 = p.weights + p.scratch_fixed + 300 * (p.kv_per_token * p.n_slots + p.scratch_per_token)
    tight = Engine(EngineOptions(model=str(path), backend="numpy", mem_budget_mb=-(-room_for_300 // MIB), parallel=1))
    assert tight.n_ctx == 256 and tight.kv.config.n_ctx == 256  # a multiple of CTX_STEP below 300 tokens
    assert tight.plan.total <= tight.plan.budget


def test_a_budget_below_the_weights_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)
    cmd = [sys.executable, "-m", "genie_workers.cli", "run", "-m", str(path), "--mem-budget-mb", "1", "-p", "hi"]
    r = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert_one_line_error(r, "a memory budget of 1 MB cannot hold the model")
    cmd = [*cmd[:-4], "--mem-budget-mb", "400", "-n", "2", "-p", "hi"]
    ok = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "genie: weights " in ok.stderr and "of 0.39 budget" in ok.stderr, ok.stderr
