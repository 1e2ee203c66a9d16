"""The worker's KV link when the KV store is absent: lookups return at once (no wait for the timeout)
and saves are dropped with a count, so a turn never stalls or fails for the store's sake."""

from __future__ import annotations

import pytest
import zmq

from tests.tiny_models import write_tiny_model
from workers.engine.engine import Engine, EngineConfig
from workers.engine.sampling import SamplingParams
from workers.kv_link import KvLink


@pytest.mark.timeout(60)  # with a queueing socket the lookup would wait its 600 s timeout: this fails it
def test_absent_store_costs_nothing(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_model("llama", path)
    engine = Engine(EngineConfig(model=str(path), backend="numpy", n_ctx=256, kv_dtype="f32"))
    ctx = zmq.Context()
    link = KvLink(ctx, f"ipc://{tmp_path}/no-store.sock", engine, timeout_s=600)
    try:
        prompt = [1] + [3 + i % 200 for i in range(100)]
        assert link.hydrate(prompt, "den") == 0
        for _ in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=4)):
            pass
        assert link.save("den") is False and link.saves_dropped == 1
        assert link.hydrate(prompt + [7, 8], "den") == 0
    finally:
        link.close()
        ctx.term()
