"""What is worth saving and looking up: hydrating must beat recomputing on the backend at hand."""

from __future__ import annotations

from genie_kvstore.policy import ReusePolicy
from genie_kvstore.store import CHUNK_TOKENS


def test_on_a_cpu_a_short_voice_turn_is_worth_saving():
    policy = ReusePolicy()
    policy.observe_prefill(14, 0.030)  # Gemma 270M on 2 cores: ~2 ms a token
    policy.observe_lookup(0, 0.002)
    policy.observe_lookup(100, 0.006)  # 2 ms + 40 µs a token
    assert policy.min_tokens <= 2
    assert policy.worth_saving(10, "kitchen") and policy.worth_looking_up(11, 0, "kitchen")
    assert not policy.worth_saving(10, None)  # without an id only full chunks can be found again
    assert policy.worth_saving(CHUNK_TOKENS, None)


def test_on_a_fast_gpu_only_longer_prefixes_are():
    policy = ReusePolicy()
    policy.observe_prefill(512, 512 / 60_000)  # ~17 µs a token
    policy.observe_lookup(0, 0.0015)
    policy.observe_lookup(1000, 0.0015 + 1000 * 4e-6)
    assert 90 <= policy.min_tokens <= 150
    assert not policy.worth_saving(64, "kitchen") and policy.worth_saving(400, "kitchen")
    assert not policy.worth_looking_up(60, 0, None) and policy.worth_looking_up(400, 0, None)


def test_nothing_is_gained_beyond_what_the_cache_holds_or_when_reading_is_slower():
    policy = ReusePolicy()
    policy.observe_prefill(100, 0.2)
    assert not policy.worth_looking_up(100, 99, "kitchen")  # the last token always runs for its logits
    slow_disk = ReusePolicy()
    slow_disk.observe_prefill(100, 0.001)
    slow_disk.observe_lookup(0, 0.001)
    slow_disk.observe_lookup(100, 0.5)
    assert not slow_disk.worth_saving(4000, "kitchen")


def test_a_new_worker_looks_up_any_length_for_a_conversation_and_a_chunk_without_one():
    policy = ReusePolicy()
    assert policy.worth_looking_up(5, 0, "kitchen")
    assert not policy.worth_looking_up(CHUNK_TOKENS, 0, None) and policy.worth_looking_up(CHUNK_TOKENS + 1, 0, None)
