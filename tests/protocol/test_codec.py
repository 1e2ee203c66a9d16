"""The wire format: every message round-trips; every malformed frame is a ProtocolError (with the request
id when the frame carried one), never another exception."""

from __future__ import annotations

import os
import random

import msgpack
import pytest

from genie_protocol.codec import MAX_BODY_BYTES, MESSAGE_TYPES, decode, encode
from genie_protocol.errors import BAD_FRAME, BAD_MESSAGE, ProtocolError
from genie_protocol.kv_messages import KvData, KvLookup, KvSave, KvSaveCounts, KvSaved
from genie_protocol.messages import (
    Cancel,
    Dead,
    Delta,
    Done,
    Error,
    Generate,
    Health,
    Heartbeat,
    Hello,
    KvClear,
    KvEvict,
    KvList,
    Load,
    Metrics,
    Prewarm,
    Pull,
    Ready,
    Reply,
    Status,
    Stop,
    Unload,
)

LAYOUT_EXAMPLE = {  # per pool: a sliding layer of head dim 64, a global one of 128 (as Gemma 4's)
    "dtype": "int8",
    "n_layers": 2,
    "n_kv_heads": [2, 2],
    "head_dim": [64, 128],
    "v_head_dim": [64, 128],
    "windows": [512, 0],
}
EXAMPLES = [
    Generate(
        request_id="r1",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        params={"temperature": 0.0, "max_tokens": 12, "stop": ["\n"], "seed": 7},
        conv_id="kitchen",
        priority="voice",
    ),
    Generate(request_id="r2", prompt="Once upon a time", stream=False, priority="background", think=True),
    Generate(request_id="r3", token_ids=[2, 818, 5279]),
    Delta(request_id="r1", text="Hello.", token_ids=[9259, 236761], sentence_end=True),
    Delta(request_id="r1", text="", token_ids=[]),
    Done(
        request_id="r1",
        finish_reason="stop",
        usage={"prompt_tokens": 5, "cached_tokens": 0, "completion_tokens": 2},
        timings={"ttft_ms": 12.5, "prefill_tok_s": 400.0, "decode_tok_s": 90.0},
    ),
    Error(request_id="r1", code="overloaded", message="the queue is full"),
    Error(code="bad_frame", message="empty frame"),
    Cancel(request_id="r1"),
    Prewarm(request_id="p1", messages=[{"role": "system", "content": "You are a home assistant."}]),
    Status(request_id="a1"),
    Health(request_id="a2"),
    Load(request_id="a3", model="gemma3-270m"),
    Unload(request_id="a4"),
    Metrics(request_id="a5"),
    KvList(request_id="a6"),
    KvEvict(request_id="a7", entry_id="c-kitchen"),
    KvClear(request_id="a8"),
    Pull(request_id="a9", model="hf://Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf"),
    Stop(request_id="a10"),
    Reply(request_id="a1", data={"model": "gemma3-270m", "queue": 0}),
    Hello(protocol_version=1, pid=1234),
    Ready(model="gemma3-270m", ctx=4096, parallel=1, backend="numpy", device="numpy", load_ms=5000.0),
    Heartbeat(seq=3, busy=True),
    Heartbeat(seq=4, kv_saves=KvSaveCounts(acked=2, kept=1, handed_over=1).body()),
    Dead(reason="CUDA error: an illegal memory access"),
    KvSave(request_id="k1", fingerprint="ab" * 32, layout=LAYOUT_EXAMPLE, token_ids=[1, 2, 3], conv_id="kitchen"),
    KvLookup(request_id="k2", fingerprint="0f" * 32, layout=LAYOUT_EXAMPLE, token_ids=[1, 2], longer_than=1),
    KvData(request_id="k2", n_tokens=2),
    KvSaved(request_id="k1", bytes=12345),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    frames = encode(msg, side=[b"\x00\x01raw"])
    out, side = decode(frames)
    assert out == msg and side == [b"\x00\x01raw"]


def test_every_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(MESSAGE_TYPES.values())


def body(type_code: int, payload) -> list[bytes]:
    return [bytes((type_code,)) + msgpack.packb(payload, use_bin_type=True)]


@pytest.mark.parametrize(
    "payload,fragment",
    [
        ({"prompt": "x"}, "missing field 'request_id'"),
        ({"request_id": "r", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "exactly one"),
        ({"request_id": "r"}, "exactly one"),
        ({"request_id": "r", "token_ids": []}, "exactly one"),
        ({"request_id": "r", "token_ids": [1, -2]}, "token_ids"),
        ({"request_id": "r", "prompt": 5}, "prompt"),
        ({"request_id": "r", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"request_id": "r", "messages": [{"role": "user", "content": ["x"]}]}, "content"),
        ({"request_id": "r", "prompt": "x", "params": {"temperature": "hot"}}, "temperature"),
        ({"request_id": "r", "prompt": "x", "params": {"stop": [1]}}, "stop"),
        ({"request_id": "r", "prompt": "x", "params": {"max_tokens": True}}, "max_tokens"),
        ({"request_id": "r", "prompt": "x", "priority": "urgent"}, "priority"),
        ({"request_id": "r", "prompt": "x", "params": [1]}, "params"),
        ({"request_id": "r", "prompt": "x", "conv_id": "../../etc/passwd"}, "conv_id"),
        ({"request_id": "r", "prompt": "x", "conv_id": "a b"}, "conv_id"),
    ],
)
def test_bad_generate_names_the_problem_and_keeps_the_request_id(payload, fragment):
    with pytest.raises(ProtocolError) as e:
        decode(body(Generate.TYPE, payload))
    assert e.value.code == BAD_MESSAGE and fragment in e.value.message
    assert e.value.request_id == payload.get("request_id")


GOOD_KV = {"request_id": "k", "fingerprint": "ab" * 32, "token_ids": [1, 2]}


@pytest.mark.parametrize(
    "change,fragment",
    [
        ({"fingerprint": "AB" * 32}, "fingerprint"),
        ({"fingerprint": "ab" * 31}, "fingerprint"),
        ({"layout": {**LAYOUT_EXAMPLE, "dtype": "int4"}}, "dtype"),
        ({"layout": {**LAYOUT_EXAMPLE, "n_layers": 0}}, ">= 1"),
        ({"layout": {**LAYOUT_EXAMPLE, "windows": [0]}}, "windows needs one value per pool"),
        ({"layout": {**LAYOUT_EXAMPLE, "head_dim": [64]}}, "head_dim needs one value per pool"),
        ({"layout": {**LAYOUT_EXAMPLE, "head_dim": [64, 0]}}, "head_dim must be in [1, 4096]"),
        ({"layout": {**LAYOUT_EXAMPLE, "n_kv_heads": [2, 5000]}}, "n_kv_heads must be in [1, 1024]"),
        ({"layout": {**LAYOUT_EXAMPLE, "n_kv_heads": 2}}, "n_kv_heads must be a list"),
        ({"layout": {**LAYOUT_EXAMPLE, "windows": [0, -1]}}, "windows"),
        ({"layout": [1]}, "layout"),
        ({"token_ids": "abc"}, "token_ids"),
    ],
)
def test_bad_kv_requests_name_the_problem(change, fragment):
    for cls in (KvSave, KvLookup):
        with pytest.raises(ProtocolError) as e:
            decode(body(cls.TYPE, {**GOOD_KV, "layout": LAYOUT_EXAMPLE, **change}))
        assert e.value.code == BAD_MESSAGE and fragment in e.value.message and e.value.request_id == "k"


def test_unknown_type_keeps_the_request_id():
    with pytest.raises(ProtocolError) as e:
        decode(body(0x7E, {"request_id": "r9"}))
    assert e.value.code == BAD_FRAME and e.value.request_id == "r9" and "0x7e" in e.value.message


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b""],
        [b"\x01"],
        [b"\x01\xc1"],
        [b"\x01" + msgpack.packb({"request_id": "r"}) + b"extra"],
        [b"\x01" + b"\x91" * 100_000],
        [b"\x01" + b"\xdb\xff\xff\xff\xf0abc"],
        [b"\x01" + b"\xdd\xff\xff\xff\xf0"],
        [b"\x01" + msgpack.packb({1: 2})],
        [b"\x03" + msgpack.packb("text")],
        [b"\x01" + b"\xa3\xff\xfe\xfd"],
    ],
    ids=[
        "none",
        "empty",
        "type-only",
        "reserved-byte",
        "extra-data",
        "deep-nesting",
        "huge-str-length",
        "huge-array-length",
        "int-keys",
        "not-a-map",
        "bad-utf8",
    ],
)
def test_malformed_frames_are_protocol_errors(frames):
    with pytest.raises(ProtocolError):
        decode(frames)


def test_oversize_body_is_refused_before_parsing():
    with pytest.raises(ProtocolError, match="at most"):
        decode([b"\x01" + b"\x00" * (MAX_BODY_BYTES + 1)])
    with pytest.raises(ProtocolError, match="side frames"):
        decode(encode(Cancel(request_id="r")) + [b""] * 65)


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "str", "float", "bool", "none", "bytes"] + (["list", "map"] if depth < 6 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.choice([0, -1, 1 << 40, -(1 << 63), rng.randint(-1000, 1000)])
    if kind == "str":
        return rng.choice(["", "r1", "user", "x" * rng.randint(0, 300), "\x00\ud7ff"])
    if kind == "float":
        return rng.choice([0.5, float("nan"), float("inf"), -1e308])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "bytes":
        return os.urandom(rng.randint(0, 20))
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = [
        "request_id",
        "messages",
        "prompt",
        "token_ids",
        "params",
        "role",
        "content",
        "text",
        "code",
        "message",
        "finish_reason",
        "data",
        "model",
        "conv_id",
        "stop",
        "temperature",
    ]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def fuzz(n: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    outcome = {"ok": 0, "error": 0, "error_with_id": 0}
    for i in range(n):
        mode = i % 3
        type_code = rng.choice([*MESSAGE_TYPES, rng.randint(0, 255)])
        if mode == 0:  # random bytes after a type byte
            frames = [bytes((type_code,)) + os.urandom(rng.randint(0, 64))]
        elif mode == 1:  # well-formed msgpack of the wrong shape
            frames = [bytes((type_code,)) + msgpack.packb(_random_value(rng), use_bin_type=True)]
        else:  # a valid message with one field replaced by something random
            msg = rng.choice(EXAMPLES)
            payload = msg.body()
            payload[rng.choice([*payload, "extra"])] = _random_value(rng)
            frames = [bytes((msg.TYPE,)) + msgpack.packb(payload, use_bin_type=True)]
        try:
            decode(frames)
            outcome["ok"] += 1
        except ProtocolError as e:
            outcome["error"] += 1
            outcome["error_with_id"] += e.request_id is not None
    return outcome


def test_fuzz_short():
    out = fuzz(1000, seed=1)
    assert out["error"] > 500 and out["error_with_id"] > 50  # the generator really produces bad frames


@pytest.mark.soak
def test_fuzz_long():
    fuzz(100_000, seed=2)


def test_a_heartbeats_save_counts_read_back_typed_and_bad_values_read_zero():
    counts = KvSaveCounts(acked=3, kept=2, handed_over=1, dropped=1, held=1, held_bytes=4096)
    assert KvSaveCounts.from_body(counts.body()) == counts
    odd = {"acked": "3", "kept": -1, "dropped": True, "held": 2.5, "handed_over": 7, "newer_field": 9}
    assert KvSaveCounts.from_body(odd) == KvSaveCounts(handed_over=7)
