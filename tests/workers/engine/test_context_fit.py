"""Conversations longer than the context: the system messages and the newest turns kept, the oldest turns
dropped whole, as Ollama does (issue 16: Home Assistant got a 400 and showed the person an error)."""

from __future__ import annotations

import random

import pytest

from genie_common.errors import RequestError
from genie_workers.engine.context_fit import fit_messages


def render(messages):
    """A stand-in chat template: 3 tokens of framing a message plus one a word, and a BOS."""
    calls.append(len(messages))
    return [0] + [1 for m in messages for _ in range(3 + len(m["content"].split()))]


calls: list[int] = []


def words(n: int) -> str:
    return " ".join(["w"] * n)


def conversation(n_turns: int, tool_in: int | None = None) -> list[dict]:
    out = [{"role": "system", "content": words(20)}]
    for i in range(n_turns):
        out.append({"role": "user", "content": words(30) + f" {i}"})
        if i == tool_in:
            out.append({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "lights"}}]})
            out.append({"role": "tool", "content": words(10)})
        out.append({"role": "assistant", "content": words(40)})
    out.append({"role": "user", "content": words(15) + " last"})
    return out


def test_a_conversation_that_fits_is_untouched():
    msgs = conversation(2)
    fitted = fit_messages(render, msgs, 10_000)
    assert fitted.dropped == 0 and fitted.ids == render(msgs)


@pytest.mark.parametrize("budget", [150, 300, 500, 900])
def test_the_fewest_oldest_turns_are_dropped(budget):
    msgs = conversation(12)
    fitted = fit_messages(render, msgs, budget)
    kept = msgs[:1] + msgs[1 + fitted.dropped :]
    assert fitted.ids == render(kept) and len(fitted.ids) <= budget
    assert kept[0]["role"] == "system" and kept[1]["role"] == "user" and kept[-1]["content"].endswith("last")
    one_more_turn = msgs[:1] + msgs[1 + fitted.dropped - 2 :] if fitted.dropped else None
    assert one_more_turn is None or len(render(one_more_turn)) > budget  # the fewest


def test_a_tool_result_goes_with_the_turn_that_called_it():
    msgs = conversation(6, tool_in=2)
    for budget in range(100, 700, 7):
        kept_roles = [m["role"] for m in msgs[:1] + msgs[1 + fit_messages(render, msgs, budget).dropped :]]
        assert kept_roles[1] == "user"  # never a tool result or an answer without the question before it


def test_bisection_renders_a_logarithmic_number_of_times():
    msgs = conversation(200)
    calls.clear()
    fit_messages(render, msgs, 400)
    assert len(calls) <= 12


def test_refused_only_when_the_system_message_and_the_last_question_do_not_fit():
    msgs = conversation(3)
    with pytest.raises(RequestError, match="the system message and the last user message alone are"):
        fit_messages(render, msgs, 30)


def test_matches_a_linear_search_on_random_conversations():
    rng = random.Random(7)
    for _ in range(50):
        msgs = [{"role": "system", "content": words(rng.randrange(1, 40))}]
        for _turn in range(rng.randrange(1, 15)):
            msgs.append({"role": "user", "content": words(rng.randrange(1, 60))})
            msgs.append({"role": "assistant", "content": words(rng.randrange(1, 60))})
        msgs.append({"role": "user", "content": words(rng.randrange(1, 20))})
        budget = rng.randrange(40, 1500)
        starts = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        want = next((msgs[:1] + msgs[s:] for s in starts if len(render(msgs[:1] + msgs[s:])) <= budget), None)
        if want is None:
            with pytest.raises(RequestError):
                fit_messages(render, msgs, budget)
            continue
        fitted = fit_messages(render, msgs, budget)
        assert fitted.ids == render(want if len(render(msgs)) > budget else msgs)
