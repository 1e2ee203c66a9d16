"""Engine behaviour on the real models: prefix reuse, cancel, limits, KV export/import."""

import numpy as np
import pytest

from genie_common.errors import RequestError
from genie_workers.engine.engine import Completion, Delta
from genie_workers.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def run(engine, ids, params=GREEDY, cancel=lambda: False) -> tuple[list[Delta], Completion]:
    events = list(engine.generate(ids, params, cancel=cancel))
    *deltas, done = events
    assert isinstance(done, Completion) and all(isinstance(d, Delta) for d in deltas)
    return deltas, done


def forget(engine):
    engine.kv.clear(0)


def test_deltas_add_up_to_the_text_and_tokens(make_engine):
    e = make_engine("smollm2-135m")
    deltas, done = run(e, e.chat_prompt([{"role": "user", "content": "Name three colours."}]))
    assert "".join(d.text for d in deltas) == done.text
    assert [t for d in deltas for t in d.token_ids] == [t for t in done.token_ids if t not in e.tokenizer.eog_ids]
    assert done.text == e.tokenizer.decode(done.token_ids)


def test_greedy_is_deterministic_and_prefix_is_reused(make_engine):
    e = make_engine("gemma3-270m")
    forget(e)
    ids = e.text_prompt("The quick brown fox jumps over the lazy dog. " * 4)
    _, first = run(e, ids)
    _, again = run(e, ids)
    assert first.cached_tokens == 0
    assert again.cached_tokens == len(ids) - 1  # capped: the last prompt token is always run
    assert again.token_ids == first.token_ids
    longer = ids + e.tokenizer.encode(" And then", add_bos=False)
    _, cont = run(e, longer)
    assert cont.cached_tokens == len(ids)  # the first generated token differs from " And": KV of the prompt only


def test_prefix_reuse_gives_same_tokens_as_cold_run(make_engine):
    e = make_engine("smollm2-135m")
    convo = [{"role": "user", "content": "Hello!"}]
    forget(e)
    _, a = run(e, e.chat_prompt(convo))
    convo2 = convo + [{"role": "assistant", "content": a.text}, {"role": "user", "content": "Say it again."}]
    _, warm = run(e, e.chat_prompt(convo2))
    assert warm.cached_tokens > 20
    forget(e)
    _, cold = run(e, e.chat_prompt(convo2))
    assert cold.cached_tokens == 0
    assert cold.token_ids == warm.token_ids


def test_max_tokens_and_finish_reasons(make_engine):
    e = make_engine("gemma3-270m")
    ids = e.text_prompt("Once upon a time")
    _, done = run(e, ids, SamplingParams(temperature=0, max_tokens=3))
    assert done.finish_reason == "length" and done.completion_tokens == 3
    _, none = run(e, ids, SamplingParams(temperature=0, max_tokens=0))
    assert none.finish_reason == "length" and none.token_ids == []


def test_stop_string_ends_generation_without_the_stop_text(make_engine):
    e = make_engine("gemma3-270m")
    ids = e.text_prompt("1, 2, 3, 4, 5, 6,")
    _, free = run(e, ids, SamplingParams(temperature=0, max_tokens=12))
    assert " 8" in free.text, free.text
    _, stopped = run(e, ids, SamplingParams(temperature=0, max_tokens=12, stop=(" 8",)))
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(" 8")]


def test_eos_stops_with_reason_stop(make_engine):
    e = make_engine("smollm2-135m")
    _, done = run(
        e, e.chat_prompt([{"role": "user", "content": "Say OK."}]), SamplingParams(temperature=0, max_tokens=64)
    )
    assert done.finish_reason == "stop"
    assert done.token_ids[-1] in e.tokenizer.eog_ids


def test_cancel_during_prefill_stops_between_chunks(make_engine):
    e = make_engine("smollm2-135m")
    forget(e)
    ids = e.text_prompt("word " * 700)
    calls = []

    asks_a_chunk = 1 + e.model.config.n_layers  # before the chunk, then after each layer

    def cancel():
        calls.append(1)
        return len(calls) > asks_a_chunk  # let the first chunk run, cancel before the second

    _, done = run(e, ids, cancel=cancel)
    assert done.finish_reason == "cancelled" and done.token_ids == []
    assert e.kv.n_held(0) == e.options.prefill_chunk  # what was prefilled stays reusable
    _, after = run(e, ids, SamplingParams(temperature=0, max_tokens=1))
    assert after.cached_tokens == e.options.prefill_chunk


@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_cancel_during_prefill_stops_after_the_layer_it_arrives_in(make_engine, model):
    """A 256-token chunk takes 0.3-1 s on 2 cores: a barge-in must not wait for the chunk to end (the
    CPU backend asks after every layer; issue 16 item 9: 0.76 s and 5.75 s before)."""
    e = make_engine(model)
    forget(e)
    ids = e.text_prompt("word " * 300)
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) >= 4  # arrives while layer 3 of the first chunk runs

    _, done = run(e, ids, cancel=cancel)
    assert done.finish_reason == "cancelled" and done.token_ids == []
    assert len(calls) == 4  # asked once more after that layer, and no layer ran after the answer
    assert e.kv.held(0) == ()  # the chunk's half-written rows are not counted as held
    _, after = run(e, ids, SamplingParams(temperature=0, max_tokens=1))
    assert after.cached_tokens == 0 and after.finish_reason == "length"


def test_cancel_during_decode(make_engine):
    e = make_engine("gemma3-270m")
    n = []
    prefill_asks = 1 + e.model.config.n_layers
    _, done = run(
        e,
        e.text_prompt("Hello"),
        SamplingParams(temperature=0, max_tokens=50),
        cancel=lambda: n.append(1) or len(n) > prefill_asks + 4,
    )
    assert done.finish_reason == "cancelled" and 0 < done.completion_tokens < 50


def test_bad_prompts_are_request_errors(make_engine):
    e = make_engine("smollm2-135m")
    with pytest.raises(RequestError, match="empty"):
        list(e.generate([]))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        list(e.generate([1, 10**9]))
    with pytest.raises(RequestError, match="do not fit"):
        list(e.generate([1] * e.n_ctx))


def test_context_limit_finishes_with_length(make_engine):
    e = make_engine("smollm2-135m", n_ctx=64)
    ids = e.text_prompt("count: " + "1 " * 25)
    _, done = run(e, ids, SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True))
    assert done.finish_reason == "length"
    assert done.prompt_tokens + done.completion_tokens == e.n_ctx + 1  # the last sampled token needs no KV slot


@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
def test_export_import_continues_exactly(make_engine, kv_dtype):
    e = make_engine("gemma3-270m", kv_dtype=kv_dtype)
    forget(e)
    ids = e.text_prompt("The history of the Roman Empire")
    _, ref = run(e, ids)
    snap = e.export_kv()
    assert snap.n_tokens == e.kv.n_held(0)
    assert snap.k[0].shape == (snap.n_tokens, e.model.config.n_kv_heads, e.model.config.head_dim)
    assert (snap.k_scale is not None) == (kv_dtype == "int8")
    forget(e)
    run(e, e.text_prompt("Something else entirely, to overwrite the cache"))
    e.import_kv(snap)
    _, again = run(e, ids)
    assert again.cached_tokens == len(ids) - 1
    assert again.token_ids == ref.token_ids


def test_import_rejects_foreign_shapes(make_engine):
    e = make_engine("gemma3-270m")
    run(e, e.text_prompt("abc"))
    snap = e.export_kv()
    snap.k = snap.k[:-1]
    with pytest.raises(ValueError, match="layers"):
        e.import_kv(snap)


def test_int8_cache_holds_per_position_head_scales(make_engine):
    e = make_engine("gemma3-270m")
    forget(e)
    run(e, e.text_prompt("Scales are absmax over 127."), SamplingParams(temperature=0, max_tokens=1))
    snap = e.export_kv()
    k, s = snap.k[0].astype(np.float32), snap.k_scale[0]
    assert snap.k[0].dtype == np.int8 and s.dtype == np.float32
    assert np.abs(snap.k[0]).max(axis=-1).min() == 127  # every (position, head) row uses the full range
    assert np.all(s > 0) and k.shape[:2] == s.shape


def test_text_held_back_for_a_possible_stop_string_is_kept_when_generation_ends(make_engine):
    e = make_engine("gemma3-270m")
    ids = e.text_prompt("1, 2, 3, 4, 5, 6,")
    _, free = run(e, ids, SamplingParams(temperature=0, max_tokens=4))
    # a stop string that starts like the end of the text but never completes: held back, then flushed
    tail = free.text[-2:]
    _, held = run(e, ids, SamplingParams(temperature=0, max_tokens=4, stop=(tail + "\x00never",)))
    assert held.finish_reason == "length"
    assert held.text == free.text


def test_text_held_back_for_a_possible_stop_string_is_kept_at_end_of_turn(make_engine):
    e = make_engine("smollm2-135m")
    ids = e.chat_prompt([{"role": "user", "content": "Say OK."}])
    _, free = run(e, ids, SamplingParams(temperature=0, max_tokens=64))
    assert free.finish_reason == "stop" and free.text
    _, held = run(e, ids, SamplingParams(temperature=0, max_tokens=64, stop=(free.text[-1] + "\x00never",)))
    assert held.finish_reason == "stop"
    assert held.text == free.text


def test_a_stop_string_matching_the_first_token_still_reports_its_id(make_engine):
    e = make_engine("gemma3-270m")
    ids = e.text_prompt("1, 2, 3, 4, 5, 6,")
    _, free = run(e, ids, SamplingParams(temperature=0, max_tokens=1))
    first = e.tokenizer.decode(free.token_ids)
    deltas, done = run(e, ids, SamplingParams(temperature=0, max_tokens=5, stop=(first,)))
    assert done.finish_reason == "stop" and done.text == ""
    assert [t for d in deltas for t in d.token_ids] == done.token_ids


def test_import_rejects_wrong_dtypes_and_short_scale_lists_without_touching_the_slot(make_engine):
    e = make_engine("gemma3-270m")
    ids = e.text_prompt("The same prefix again")
    run(e, ids)
    snap = e.export_kv()
    bad = [
        dict(k=[k.astype(np.float32) for k in snap.k]),
        dict(k_scale=snap.k_scale[:-1]),
        dict(token_ids=snap.token_ids[:-1]),
    ]
    for change in bad:
        broken = type(snap)(**{**snap.__dict__, **change})
        with pytest.raises(ValueError):
            e.import_kv(broken)
    e.import_kv(snap)
    assert list(e.kv.held(0)) == list(snap.token_ids)


def test_media_placeholders_the_model_writes_reach_the_token_ids_but_never_the_text(make_engine):
    """Gemma 3 270M writes "<start_of_image>" (USER_DEFINED in its GGUF) between sentences (issue 16: in
    "The capital of France is" at temperature 0.8). Every path's text comes from the engine's deltas,
    which must leave it out while still carrying its id. After this prompt greedy decoding writes it
    first (logit 23.6 against 21.8 for the next token, "\n\n")."""
    e = make_engine("gemma3-270m")
    forget(e)
    start_of_image = e.tokenizer.vocab.token_to_id["<start_of_image>"]
    capitals = "The capital of France is Paris.<start_of_image>The capital of Spain is Madrid."
    ids = e.text_prompt(capitals)
    banned, e._banned = e._banned, None  # as before: the sampler free to write it
    try:
        deltas, done = run(e, ids)
    finally:
        e._banned = banned
    assert start_of_image in done.token_ids, "the model no longer writes it here: the test shows nothing"
    assert [t for d in deltas for t in d.token_ids] == done.token_ids
    assert "".join(d.text for d in deltas) == done.text == e.tokenizer.decode(done.token_ids)
    for text in [done.text] + [d.text for d in deltas]:
        assert "<start_of_image>" not in text, text
    # and it is never sampled: the model's next choice, a paragraph break, keeps the sentences apart
    for params in (GREEDY, SamplingParams(temperature=0.8, seed=1, max_tokens=12)):
        forget(e)
        _, done = run(e, ids, params)
        assert not set(done.token_ids) & set(e.tokenizer.vocab.media_ids)
    assert done.text  # (sampled) still an answer
    forget(e)
    assert run(e, ids)[1].text.startswith("\n\n")


@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_a_megabyte_prompt_is_refused_before_it_is_tokenized(make_engine, model, monkeypatch):
    """A 1 MiB prompt cost 7 s of worker time (Gemma's tokenizer) before it was refused (issue 21 item 8)."""
    e = make_engine(model)

    def never(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(e.tokenizer, "encode", never)
    big = "The lights are on in the kitchen. " * 31_000  # ~1 MiB
    with pytest.raises(RequestError, match="the prompt is at least .* tokens, more than the context"):
        e.text_prompt(big)
    with pytest.raises(RequestError, match="the system message and the last user message alone are at least"):
        e.fit_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": big}], 64)
    # an old turn that large is dropped without rendering it either
    encode = type(e.tokenizer).encode

    def small_only(self, text, *args, **kwargs):
        assert len(text) < 10_000, "tokenized the megabyte"
        return encode(self, text, *args, **kwargs)

    monkeypatch.setattr(type(e.tokenizer), "encode", small_only)
    monkeypatch.delattr(e.tokenizer, "encode")
    fitted = e.fit_chat(
        [{"role": "user", "content": big}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "hi"}],
        64,
    )
    assert fitted.dropped == 2 and len(fitted.ids) < 64
