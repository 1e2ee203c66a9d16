"""A conversation longer than the context, fitted as Ollama does: the system messages and the newest
turns are kept, the oldest turns dropped whole.

A turn starts at a user message and runs to the next one (the assistant's answer, its tool calls and the
tool results belong to it), so a tool result never loses the call it answers. The last user turn is never
dropped: when the system messages and it alone do not fit, the request is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from genie_common.errors import RequestError

Message = dict[str, Any]


@dataclass(frozen=True)
class Fitted:
    ids: list[int]
    dropped: int  # messages left out, oldest first


def fit_messages(
    render: Callable[[list[Message]], list[int]],
    messages: Sequence[Message],
    budget: int,
    at_least: Callable[[list[Message]], int] = lambda m: 0,
) -> Fitted:
    """The prompt of `messages` in at most `budget` tokens, dropping the fewest oldest turns it can.

    `render` turns messages into prompt tokens (the chat template). Renders O(log turns) times: more
    turns dropped never makes a prompt longer, so the fewest that fit are found by bisection.
    `at_least` bounds a rendering's length from below without rendering it (tokenizing a megabyte takes
    seconds): what it already puts over the budget is never rendered."""

    def fits(candidate: list[Message]) -> list[int] | None:
        if at_least(candidate) > budget:
            return None
        ids = render(candidate)
        return ids if len(ids) <= budget else None

    ids = fits(list(messages))
    if ids is not None:
        return Fitted(ids, 0)
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    system = [m for m in messages if m.get("role") == "system"]

    def without(n_turns: int) -> list[Message]:
        """The system messages and the conversation from its (n_turns + 1)-th user turn on."""
        first = starts[n_turns] if n_turns < len(starts) else len(messages)
        return system + [m for m in messages[first:] if m.get("role") != "system"]

    # what comes before the first user message (an assistant's greeting) goes with the first turn
    lo, hi = 0, max(len(starts) - 1, 0)  # hi: all but the last user turn dropped
    last = fits(without(hi))
    if last is None:
        bound = at_least(without(hi))
        n, qualifier = (bound, "at least ") if bound > budget else (len(render(without(hi))), "")
        raise RequestError(
            f"the system message and the last user message alone are {qualifier}{n} tokens, "
            f"more than the {budget} this context leaves for a prompt"
        )
    best = last
    while lo + 1 < hi:  # invariant: dropping hi turns fits, dropping lo does not
        mid = (lo + hi) // 2
        candidate = fits(without(mid))
        if candidate is not None:
            hi, best = mid, candidate
        else:
            lo = mid
    kept = without(hi)
    return Fitted(best, len(messages) - len(kept))
