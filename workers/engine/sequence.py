"""One request's state in the engine: its prompt, where it stands in its slot, and what it has said.

The scheduler (scheduler.py) moves a sequence through waiting -> prefilling -> decoding -> finished and
hands it each sampled token; the sequence turns tokens into text (`Delta`s), watches for its own ends
(end of generation, a stop string, a complete JSON value, its token limit, a full context) and builds its
`Completion`. Nothing here touches the device.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from genie_protocol.messages import DEFAULT_PRIORITY, PRIORITIES, FinishReason, Priority, Timings

from .constraint import JsonConstraint
from .sampling import Sampler, SamplingParams
from .text_filters import StopMatcher
from .tokenizer import Tokenizer

PRIORITY_RANK = {p: rank for rank, p in enumerate(PRIORITIES)}  # a voice prompt's prefill goes first
_arrivals = itertools.count()


@dataclass
class Delta:
    text: str
    token_ids: list[int]


@dataclass
class Completion:
    finish_reason: FinishReason
    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    timings: Timings  # DONE's, as the worker sends them (protocol/messages.py)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Failed:
    """The sequence ended with an error of its own (a bad constraint, non-finite logits); the others go on."""

    error: Exception


Event = Delta | Completion | Failed


class Sequence:
    def __init__(
        self,
        prompt: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        cancel: Callable[[], bool] = lambda: False,
        constraint: JsonConstraint | None = None,
        priority: Priority = DEFAULT_PRIORITY,
        slot: int | None = None,
        n_ctx: int = 0,
    ) -> None:
        """`prompt` is checked by the engine (Engine.sequence); `slot`: run in this slot only; `n_ctx`: the
        tokens prompt and answer may take together (0: as many as the slot holds)."""
        self.prompt = prompt
        self.n_ctx = n_ctx
        self.params = params
        self.cancel = cancel
        self.constraint = constraint
        self.priority = priority
        self.pinned_slot = slot
        self.order = (PRIORITY_RANK[priority], next(_arrivals))  # voice first, then first come
        self.slot = -1  # given at admission
        self.cached = 0  # prompt tokens its slot already held when it was admitted
        self.pos = 0  # tokens its slot holds (its K/V written)
        self.last_token = -1  # sampled, not yet run: the next decode step's input
        self.sampler = Sampler(params)
        self.eog = frozenset() if params.ignore_eos else tokenizer.eog_ids
        self.history = list(prompt)  # what the repeat penalty looks back over
        self.decoder = tokenizer.stream()
        self.stop = StopMatcher(params.stop)
        self.generated: list[int] = []
        self.pending_ids: list[int] = []  # sampled, not yet in a Delta (their text is held back)
        self.text_parts: list[str] = []
        self.finish: FinishReason | None = None
        self._stop_hit = False  # a stop string matched: what follows it is dropped, not flushed
        self.t_start = time.perf_counter()
        self.t_prefill = self.t_first = self.t_start  # both set when the prefill ends, t_first again at a token
        # argmax where the logits are, unless the sampler or a grammar needs them on the host
        self.on_device = params.is_greedy and params.repeat_penalty == 1.0 and constraint is None

    @property
    def prefilling(self) -> bool:
        return self.pos < len(self.prompt)

    @property
    def done(self) -> bool:
        return self.finish is not None

    def sample_host(self, row: np.ndarray) -> int:
        """A token from finite logits [vocab] on the host (banned tokens already at the floor)."""
        return self.sampler.sample(self.constraint.mask(row) if self.constraint else row, self.history)

    def _at_length(self, pos: int, n_generated: int, slot_ctx: int) -> bool:
        """No room for another forward pass (pos tokens in its slot), or no need of one."""
        return pos >= (self.n_ctx or slot_ctx) or n_generated >= self.params.max_tokens

    def runs_after_next(self, slot_ctx: int) -> bool:
        """Whether the token sampled next, whatever it is, leaves room and need for a pass after it (pos: the
        tokens in its slot once that token's pass is launched): its length and context do not end it there."""
        return not self._at_length(self.pos, len(self.generated) + 1, slot_ctx)

    def ends_with(self, token: int, slot_ctx: int) -> bool:
        """Whether accepting `token` surely ends the sequence (end of generation, its token limit, a full
        context); a stop string or a complete JSON value can end it too, which only `accept` finds."""
        return token in self.eog or not self.runs_after_next(slot_ctx)

    def accept(self, token: int, slot_ctx: int, pos: int | None = None) -> list[Event]:
        """A sampled token: its text, and whether the sequence ends with it (then `finish` is set). `pos`: the
        tokens its slot held when the token was sampled (a step launched ahead has moved `self.pos` on)."""
        pos = self.pos if pos is None else pos
        if self.constraint:
            self.constraint.advance(token)
        if not self.generated:
            self.t_first = time.perf_counter()
        self.generated.append(token)
        self.history.append(token)
        if token in self.eog:
            self.finish = "stop"
            return []
        events: list[Event] = []
        text, hit = self.stop.feed(self.decoder.add(token))
        self.pending_ids.append(token)
        if text or (hit and self.pending_ids):  # every token id reaches a Delta, even with no text
            self.text_parts.append(text)
            events.append(Delta(text, self.pending_ids))
            self.pending_ids = []
        if hit:
            self.finish, self._stop_hit = "stop", True
        elif self.constraint and self.constraint.finished:  # the JSON is complete: nothing may follow
            self.finish = "stop"
        elif self._at_length(pos, len(self.generated), slot_ctx):
            self.finish = "length"
        else:
            self.last_token = token
        return events

    def end(self, reason: FinishReason | None = None) -> list[Event]:
        """The last Delta (text held back for a stop string that never came) and the Completion."""
        if reason is not None:
            self.finish = reason
        assert self.finish is not None
        events: list[Event] = []
        if not self._stop_hit and self.generated:
            tail = self.stop.feed(self.decoder.flush())[0] + self.stop.flush()
            if tail or self.pending_ids:
                self.text_parts.append(tail)
                events.append(Delta(tail, self.pending_ids))
                self.pending_ids = []
        t_end = time.perf_counter()
        n_prefilled = len(self.prompt) - self.cached
        prefill_s, decode_s = self.t_prefill - self.t_start, t_end - self.t_first
        n = len(self.generated)
        timings = Timings(  # ttft: the request's start to its first token sampled
            ttft_ms=(self.t_first - self.t_start) * 1000,
            prefill_ms=prefill_s * 1000,
            decode_ms=decode_s * 1000,
            prefill_tok_s=n_prefilled / prefill_s if prefill_s > 0 else 0.0,
            decode_tok_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
        )
        text = "".join(self.text_parts)
        events.append(Completion(self.finish, text, list(self.generated), len(self.prompt), self.cached, timings))
        return events
