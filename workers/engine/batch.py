"""One engine step's input: a flat batch of tokens from several sequences, each run in its own KV slot.

A segment is one sequence's share of a step: a decode step's one token, or a chunk of a prompt. Its
tokens sit side by side with the other segments' in one [n_tokens] array, so every product of the step
reads the weights once for all of them; only attention (and the K/V it stores) is per segment, over that
segment's own slot and length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Segment:
    slot: int  # the KV slot the sequence runs in
    pos0: int  # the position of its first token here (the tokens its slot holds before this step)
    ids: tuple[int, ...]
    wants_logits: bool  # whether the step returns logits of its last token (a decode step, a prompt's end)
    # the row whose logits it wants, counted from its first: its last unless padded to a captured step's size
    logit_row: int = -1

    @property
    def n(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Batch:
    """Segments in the order their rows sit in the step; at most one segment a slot."""

    segments: tuple[Segment, ...]
    ids: np.ndarray = field(init=False)  # [n_tokens] int64: the segments' tokens, side by side
    starts: tuple[int, ...] = field(init=False)  # the first row of each segment
    logit_rows: np.ndarray = field(init=False)  # rows whose logits the step returns, in segment order

    def __post_init__(self) -> None:
        if not self.segments or any(s.n == 0 for s in self.segments):
            raise ValueError("a batch needs at least one segment, each of at least one token")
        if len({s.slot for s in self.segments}) != len(self.segments):
            raise ValueError("two segments of one batch share a slot")
        starts = np.cumsum([0] + [s.n for s in self.segments])
        ids = np.fromiter((t for s in self.segments for t in s.ids), dtype=np.int64, count=int(starts[-1]))
        rows = [int(starts[i]) + s.logit_row % s.n for i, s in enumerate(self.segments) if s.wants_logits]
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "starts", tuple(int(x) for x in starts[:-1]))
        object.__setattr__(self, "logit_rows", np.asarray(rows, dtype=np.int64))

    @classmethod
    def of(cls, segments: Sequence[Segment]) -> Batch:
        return cls(tuple(segments))

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[0])

    def rows(self, i: int) -> slice:
        """The rows of segment i."""
        start = self.starts[i]
        return slice(start, start + self.segments[i].n)

    def positions(self, i: int) -> np.ndarray:
        s = self.segments[i]
        return np.arange(s.pos0, s.pos0 + s.n)

    @property
    def row_groups(self) -> tuple[int, ...]:
        """Rows of the step in groups that a backend computing each product row by row must keep apart
        to give every sequence the numbers it gets alone: one group per segment (segments of one token
        are one row each, the same as alone)."""
        return tuple(s.n for s in self.segments)
