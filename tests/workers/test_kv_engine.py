"""Acceptance 1 at the library level: a conversation saved, hydrated into a fresh engine and continued
gives exactly the greedy tokens of the same conversation run without interruption (INT8 and FP16 KV)."""

from __future__ import annotations

import pytest

from genie_common.engine_options import EngineOptions
from genie_kvstore.store import KVStore, StoreConfig
from genie_workers.engine.engine import Completion, Engine
from genie_workers.engine.sampling import SamplingParams
from genie_workers.kv_engine import engine_layout, hydrate, save

GREEDY = SamplingParams(temperature=0, max_tokens=24)
TURNS = [
    [{"role": "system", "content": "You are a helpful home assistant. Answer in one or two short sentences."}]
    + [{"role": "user", "content": "What is a good temperature for a bedroom at night, and why does it matter?"}],
    [{"role": "user", "content": "And during the day?"}],
]


def run_turn(engine: Engine, history: list[dict]):
    ids = engine.chat_prompt(history)
    out = list(engine.generate(ids, GREEDY))
    done = out[-1]
    assert isinstance(done, Completion)
    return ids, "".join(getattr(ev, "text", "") for ev in out[:-1]), done


@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
def test_saved_hydrated_conversation_continues_exactly(tmp_path, kv_dtype):
    from tests.conftest import load_model

    model = load_model("smollm2-135m")
    options = EngineOptions(model="smollm2-135m", ctx=1024, parallel=1)
    # uninterrupted: one engine, turn 2 reuses the KV turn 1 left resident
    a = Engine(options, model=model, kv_dtype=kv_dtype)
    history = list(TURNS[0])
    _, text1, _ = run_turn(a, history)
    history2 = history + [{"role": "assistant", "content": text1}] + TURNS[1]
    _, want, done_a = run_turn(a, history2)

    # interrupted: turn 1, save, a fresh engine (a restart) hydrates from disk and runs turn 2
    b = Engine(options, model=model, kv_dtype=kv_dtype)
    store = KVStore(StoreConfig(tmp_path / "kv"), model.fingerprint, engine_layout(b))
    _, text1_b, _ = run_turn(b, history)
    assert text1_b == text1
    assert save(b, store, conv_id="bedroom") is not None
    c = Engine(options, model=model, kv_dtype=kv_dtype)
    store2 = KVStore(StoreConfig(tmp_path / "kv"), model.fingerprint, engine_layout(c))
    loaded = hydrate(c, store2, c.chat_prompt(history2), conv_id="bedroom")
    assert loaded > 40
    _, got, done_c = run_turn(c, history2)
    assert got == want
    assert done_c.cached_tokens == done_a.cached_tokens == loaded
    # and without the id, found from the prompt alone
    d = Engine(options, model=model, kv_dtype=kv_dtype)
    assert hydrate(d, store2, d.chat_prompt(history2)) == loaded
    assert run_turn(d, history2)[1] == want


@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
def test_gemma4_pools_of_two_shapes_continue_exactly(tmp_path, kv_dtype):
    """The same with a tiny Gemma 4 (issue 7): 4 pools (three of head dim 32, one of 64) for 8 layers, the
    last 4 of which read earlier layers' K/V; format v4 keeps each pool's shape."""
    from genie_workers.engine.backends.numpy_backend import NumpyBackend
    from genie_workers.engine.model import Model
    from testkit.tiny_models import write_tiny_gemma4

    path = tmp_path / "gemma4.gguf"
    write_tiny_gemma4(path, seed=0)
    model = Model.load(path, NumpyBackend())
    options = EngineOptions(model=str(path), backend="numpy", ctx=256, parallel=1)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    turn1 = [1] + [(i * 37 + 11) % 381 + 3 for i in range(70)]

    def continued(engine: Engine, ids: list[int]) -> list[int]:
        done = list(engine.generate(ids, greedy))[-1]
        assert isinstance(done, Completion)
        return done.token_ids

    a = Engine(options, model=model, kv_dtype=kv_dtype)
    reply = continued(a, turn1)
    turn2 = turn1 + reply + [5, 17, 200, 33]
    want = continued(a, turn2)

    b = Engine(options, model=model, kv_dtype=kv_dtype)
    layout = engine_layout(b)
    assert layout.n_layers == 4 and layout.head_dim == (32, 32, 32, 64) and layout.windows == (4, 4, 4, 0)
    store = KVStore(StoreConfig(tmp_path / "kv"), model.fingerprint, layout)
    assert continued(b, turn1) == reply
    assert save(b, store, conv_id="g4") is not None
    c = Engine(options, model=model, kv_dtype=kv_dtype)
    loaded = hydrate(c, KVStore(StoreConfig(tmp_path / "kv"), model.fingerprint, engine_layout(c)), turn2, "g4")
    assert loaded == len(turn1) + len(reply) - 1  # what b held: the last reply token was never run
    assert continued(c, turn2) == want
