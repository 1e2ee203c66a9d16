"""The engine's captured steps (Backend.forward_step's `steps`), with the ones keyed by a batch's make-up bounded.

A backend captures a step once per key and replays it (CUDA graphs); each capture holds its output (a step's
logits: a row of the vocabulary per stream, 0.6 MB for Qwen3) and its graph. Decode steps by their count and
prompt chunks by their size are few. Steps keyed by what a batch holds are not: a step mixing prompt chunks
with decode rows ("mixed": the sizes in order) and, on a GPU whose attention takes the slots as arguments, a
decode step by its set of slots. Arrivals at random make new ones for as long as the service runs, so those
keep the MOST_SHAPED most recently used; the oldest is dropped (its graph and output freed) for a new one,
and captured again if it comes back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

MOST_SHAPED = 32  # steps keyed by a batch's make-up kept at once


def shaped(key: Hashable) -> bool:
    """Whether a step's key names a batch's make-up (mixed steps, decode steps by their slots)."""
    if not isinstance(key, tuple) or not key:
        return False
    return key[0] == "mixed" or (key[0] == "decode" and len(key) > 1 and isinstance(key[1], tuple))


class CapturedSteps(OrderedDict[Hashable, Any]):
    """A mapping of step keys to what the backend keeps for them, least recently used first."""

    def __init__(self, most_shaped: int = MOST_SHAPED) -> None:
        super().__init__()
        self.most_shaped = most_shaped
        self.evicted = 0  # shaped steps dropped so far

    def get(self, key: Hashable, default: Any = None) -> Any:
        if key in self:
            self.move_to_end(key)
        return super().get(key, default)

    def __setitem__(self, key: Hashable, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if shaped(key):
            keys = [k for k in self if shaped(k)]
            for old in keys[: max(0, len(keys) - self.most_shaped)]:
                del self[old]
                self.evicted += 1
