"""Path F as a user depends on it, on the real default model (Gemma 3 270M: 18 KV layers): a turn saved by
one daemon is hydrated by the next one after a restart, with a conversation id and without one (Home
Assistant sends none), with INT8 KV (the default) and FP16 KV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.genie_daemon.test_daemon import start_daemon
from tests.genie_daemon.test_kv_service import ctl, stop, turn_text, wait_for_entries

SYSTEM = (
    "You are the voice assistant of a house with a kitchen, a living room, two bedrooms and a garden. "
    "Answer in one short sentence. The kitchen lights are on, the living room is at 21 degrees, the "
    "garden sprinklers run at six in the morning and the front door is locked. "
)


@pytest.mark.parametrize("kv", ["int8", "fp16"])
@pytest.mark.parametrize("conv_id", ["kitchen", None], ids=["conv-id", "no-id"])
def test_a_turn_saved_by_one_daemon_is_hydrated_by_the_next(tmp_path, kv, conv_id):
    extra = ("--fp16-kv",) if kv == "fp16" else ()
    prompt = SYSTEM + "Question: are the kitchen lights on?\nAnswer:"
    proc, endpoint = start_daemon(tmp_path, *extra, model="gemma3-270m", ctx=1024, ready_timeout_s=120)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        answer, done = turn_text(endpoint, prompt, conv_id)
        assert done.usage["prompt_tokens"] >= 64 and done.usage["cached_tokens"] == 0
        entries = wait_for_entries(sock_dir, 1)
        assert len(entries) == 1 and entries[0]["conv_id"] == (conv_id or "")
        assert entries[0]["tokens"] >= done.usage["prompt_tokens"] and entries[0]["dtype"] == kv.replace("p", "")
        table = ctl(sock_dir, "kv", "ls")
        assert table.returncode == 0 and entries[0]["id"] in table.stdout
    finally:
        stop(proc)  # SIGTERM: the new daemon has a new worker and a new store; only the disk remains

    proc, endpoint = start_daemon(tmp_path, *extra, model="gemma3-270m", ctx=1024, ready_timeout_s=120)
    try:
        follow_up = prompt + answer + "\nQuestion: and is the front door locked?\nAnswer:"
        _, done = turn_text(endpoint, follow_up, conv_id)
        assert done.usage["cached_tokens"] >= 64, done.usage
        status = json.loads(ctl(sock_dir, "--json", "status").stdout)
        assert status["kv"]["hits"] == 1 and status["kv"]["hydrated_tokens"] == done.usage["cached_tokens"]
    finally:
        stop(proc)


def test_a_short_voice_turn_is_saved_and_hydrated_after_a_restart(tmp_path):
    """A voice turn of a dozen tokens is cheaper to read back than to prefill on a CPU: it is saved."""
    prompt = "Turn off the kitchen lights."
    proc, endpoint = start_daemon(tmp_path, model="gemma3-270m", ctx=1024, backend="numpy", ready_timeout_s=120)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        answer, done = turn_text(endpoint, prompt, "voice-1", max_tokens=6)
        assert done.usage["prompt_tokens"] < 16
        entries = wait_for_entries(sock_dir, 1)
        assert entries[0]["conv_id"] == "voice-1" and entries[0]["tokens"] < 64
    finally:
        stop(proc)
    proc, endpoint = start_daemon(tmp_path, model="gemma3-270m", ctx=1024, backend="numpy", ready_timeout_s=120)
    try:
        _, done = turn_text(endpoint, prompt + answer + " And the hall?", "voice-1", max_tokens=4)
        assert done.usage["cached_tokens"] >= done.usage["prompt_tokens"] // 2, done.usage
    finally:
        stop(proc)
