"""Output constrained to JSON (llguidance): every token the grammar forbids is masked, so whatever the
model's weights, a finished answer parses and fits its schema."""

from __future__ import annotations

import json

import pytest

from tests.tiny_models import write_tiny_model
from workers.engine.engine import Completion, Engine, EngineConfig
from workers.engine.errors import RequestError
from workers.engine.sampling import SamplingParams

SWITCH = {
    "type": "object",
    "properties": {"state": {"enum": ["on", "off"]}, "level": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["state", "level"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def tiny(request, tmp_path_factory) -> Engine:
    """Random weights: left alone they write anything; constrained they must write the schema."""
    path = tmp_path_factory.mktemp("c") / f"{request.param}.gguf"
    write_tiny_model(request.param, path, seed=4)
    return Engine(EngineConfig(model=str(path), n_ctx=512, backend="numpy"))


def run(engine: Engine, fmt, temperature: float, seed: int, max_tokens: int = 200) -> Completion:
    done = list(
        engine.generate(
            engine.text_prompt("Status:"),
            SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens),
            constraint=engine.json_constraint(fmt),
        )
    )[-1]
    assert isinstance(done, Completion)
    return done


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_random_model_writes_exactly_the_schema(tiny, temperature):
    for seed in range(3):
        done = run(tiny, SWITCH, temperature, seed)
        assert done.finish_reason == "stop", done.text
        value = json.loads(done.text)
        assert set(value) == {"state", "level"} and value["state"] in ("on", "off")
        assert isinstance(value["level"], int) and 0 <= value["level"] <= 100


def test_any_json_object_is_a_valid_prefix_when_cut_short(tiny):
    done = run(tiny, "json", 1.0, 0, max_tokens=25)
    assert done.text.startswith("{")
    if done.finish_reason == "stop":
        assert isinstance(json.loads(done.text), dict)


def test_a_bad_schema_is_the_requests_error(tiny):
    with pytest.raises(RequestError, match="format"):
        tiny.json_constraint({"type": "no-such-type"})
    with pytest.raises(RequestError, match="format"):
        tiny.json_constraint("xml")  # type: ignore[arg-type]


def test_real_model_answers_in_the_schema(make_engine):
    engine = make_engine("smollm2-135m")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "on": {"type": "boolean"}},
        "required": ["name", "on"],
        "additionalProperties": False,
    }
    prompt = engine.chat_prompt([{"role": "user", "content": "The kitchen light is on. Describe it as JSON."}])
    done = list(
        engine.generate(prompt, SamplingParams(temperature=0, max_tokens=60), constraint=engine.json_constraint(schema))
    )[-1]
    assert isinstance(done, Completion) and done.finish_reason == "stop", done
    value = json.loads(done.text)
    assert set(value) == {"name", "on"} and isinstance(value["on"], bool)
