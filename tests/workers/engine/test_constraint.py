"""Output constrained to JSON (llguidance): every token the grammar forbids is masked, so whatever the
model's weights, a finished answer parses and fits its schema."""

from __future__ import annotations

import json

import pytest

from genie_common.engine_options import EngineOptions
from genie_common.errors import RequestError
from genie_workers.engine.constraint import ANY_OBJECT
from genie_workers.engine.engine import Completion, Engine
from genie_workers.engine.sampling import SamplingParams
from testkit.tiny_models import write_tiny_model
from tests.json_schema_check import violations

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
    return Engine(EngineOptions(model=str(path), ctx=512, backend="numpy", parallel=1))


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


# What Home Assistant's AI Task sends as Ollama's `format` (its structure, converted to a schema): no
# bounds on any value (issue 16).
HA_TASK = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name of the person"},
        "age": {"type": "integer"},
        "height_m": {"type": "number"},
        "is_member": {"type": "boolean"},
        "hobbies": {"type": "array", "items": {"type": "string"}},
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "height_m", "is_member", "hobbies", "colour"],
}
HA_OPTIONAL = {
    "type": "object",
    "properties": {
        "brightness": {"type": "integer", "minimum": 0, "maximum": 255},
        "temperature": {"type": "number"},
        "note": {"type": "string"},
    },
}
HA_NESTED = {
    "type": "object",
    "properties": {
        "rooms": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "lights_on": {"type": "integer"},
                    "temp_c": {"type": "number"},
                },
                "required": ["name", "lights_on"],
            },
        },
        "summary": {"type": "string"},
        "mode": {"enum": ["home", "away", "night"]},
    },
    "required": ["rooms", "summary", "mode"],
    "additionalProperties": False,
}
TASK = [
    {"role": "system", "content": "You are a Home Assistant AI task. Answer with data only."},
    {
        "role": "user",
        "content": "Generate a made-up person: name, age, height, membership, hobbies and favourite colour.",
    },
]
CAP_TOKENS = 400


def answer_ends_valid(engine: Engine, fmt, seed: int) -> None:
    """Sampled at llama.cpp's default temperature, the answer ends where the schema does, long before the
    cap, and is valid JSON that the client's own (unbounded) schema accepts."""
    params = SamplingParams(temperature=0.8, seed=seed, max_tokens=CAP_TOKENS)
    done = list(engine.generate(engine.chat_prompt(TASK), params, constraint=engine.json_constraint(fmt)))[-1]
    assert isinstance(done, Completion)
    assert done.finish_reason == "stop", (seed, done.completion_tokens, done.text[:200])
    value = json.loads(done.text)
    assert not violations(value, ANY_OBJECT if fmt == "json" else fmt), (seed, done.text)


@pytest.mark.parametrize("fmt", [HA_TASK, HA_OPTIONAL, "json"], ids=["ha-task", "ha-optional", "json"])
def test_default_model_ends_unbounded_schemas_as_valid_json(make_engine, fmt):
    engine = make_engine("gemma3-270m")
    for seed in (0, 1):
        answer_ends_valid(engine, fmt, seed)


@pytest.mark.soak
@pytest.mark.parametrize(
    "fmt", [HA_TASK, HA_OPTIONAL, HA_NESTED, "json"], ids=["ha-task", "ha-optional", "ha-nested", "json"]
)
def test_default_model_ends_unbounded_schemas_as_valid_json_soak(make_engine, fmt):
    engine = make_engine("gemma3-270m")
    for seed in range(2, 22):
        answer_ends_valid(engine, fmt, seed)


def accepts(engine: Engine, fmt, text: str) -> bool:
    """Whether the constraint for `fmt` lets `text` be written, whole, as the answer."""
    constraint = engine.json_constraint(fmt)
    ids = engine.tokenizer.encode_piece(text)
    return all(constraint.matcher.consume_token(t) for t in ids) and constraint.matcher.is_accepting()


def test_unbounded_values_get_bounds_that_end_them(make_engine):
    engine = make_engine("gemma3-270m")
    person = {"name": "Ann", "age": 41, "height_m": 1.7, "is_member": True, "hobbies": ["chess"], "colour": "red"}

    def with_(**changes) -> str:
        return json.dumps({**person, **changes}, separators=(",", ":"))

    assert accepts(engine, HA_TASK, with_())
    assert accepts(engine, HA_TASK, with_(age=-999_999_999_999_999, height_m=123.456789, hobbies=["x"] * 10))
    assert not accepts(engine, HA_TASK, with_(age=10**15))  # 16 digits
    assert not accepts(engine, HA_TASK, with_(height_m=1.1234567))  # 7 decimals
    assert not accepts(engine, HA_TASK, with_(name="a" * 129))
    assert not accepts(engine, HA_TASK, with_(hobbies=["x"] * 11))
    assert not accepts(engine, HA_TASK, with_(extra=1))  # declared properties only, as llama.cpp reads it

    assert accepts(engine, "json", '{"a":[1,"x",null],"b":{"c":true},"d":-2.5}')
    assert not accepts(engine, "json", '{"a":{"b":{"c":1}}}')  # containers one level deep
    assert not accepts(engine, "json", json.dumps({f"k{i}": i for i in range(11)}, separators=(",", ":")))
    assert not accepts(engine, "json", json.dumps({"k" * 33: 1}, separators=(",", ":")))
    assert not accepts(engine, "json", '{"a":5' + "0" * 15 + "}")


def test_the_clients_own_bounds_stay(make_engine):
    engine = make_engine("gemma3-270m")
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 300}, "maxItems": 40},
            "big": {"type": "integer", "minimum": 10**17},
        },
        "required": ["tags", "big"],
        "additionalProperties": {"type": "integer"},
    }
    many = json.dumps({"tags": ["t" * 300] * 40, "big": 10**17 + 1}, separators=(",", ":"))
    assert accepts(engine, schema, many)
