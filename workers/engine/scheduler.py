"""Decides what each engine step runs: continuous batching over the KV pool's slots.

Requests wait until a slot is free (voice before background, then first come). A step runs the next
token of every sequence that is decoding plus prompt chunks of those prefilling, voice first, under a
budget of `prefill_chunk` prompt tokens a step: a new prompt never stalls the streams that decode for
longer than one chunk, and no stream waits for another's whole prompt. A prompt is cut into the same
chunks as when it runs alone (a chunk that does not fit the step's budget waits for the next step), so a
sequence gets the same numbers in a batch as alone (batch.py, Backend.stage_rows).

A new sequence gets the free slot holding the longest prefix of its prompt (an empty one, else the least
recently used one, when none does); a longer prefix held by any other slot (a shared system prompt) is
copied into it, rows instead of recomputing them; `prepare` (the worker's KV-store lookup) may then load a
longer saved one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from genie_common.errors import ModelError
from protocol.messages import FinishReason

from .arch.layers import Interrupted
from .batch import Segment
from .sequence import Event, Failed, Sequence

if TYPE_CHECKING:
    from .engine import Engine


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    def __init__(self, engine: Engine, prepare: Callable[[Sequence], None] | None = None) -> None:
        """`prepare(seq)`: called once a sequence has its slot, before its prefill (a KV-store lookup)."""
        self.engine = engine
        self.prepare = prepare
        self.n_slots = engine.kv.config.n_slots
        self.waiting: list[Sequence] = []
        self.running: dict[int, Sequence] = {}  # slot -> the sequence in it
        self._clock = itertools.count(1)
        self._last_used = [0] * self.n_slots  # the clock when each slot's sequence last ended
        self.limit: int | None = None  # streams admitted at most (a hot device runs fewer); None: every slot
        self._freed: set[int] = set()  # slots whose sequence ended in the current step
        # launch_ahead: the pass launched and not yet sampled (its logits, the (sequence, row) pairs to sample)
        self._inflight: tuple[object, list[tuple[Sequence, int]]] | None = None
        self._ahead_shape: tuple[int, ...] | None = None  # the make-up of the last pass launched ahead

    @property
    def idle(self) -> bool:
        """Nothing waits or runs (a pass launched ahead for sequences that have all ended since is dropped)."""
        if not self.waiting and not self.running:
            self._inflight = None
            return True
        return False

    def submit(self, seq: Sequence) -> None:
        if seq.pinned_slot is not None and not 0 <= seq.pinned_slot < self.n_slots:
            raise ValueError(f"slot {seq.pinned_slot} is not one of the {self.n_slots}")
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drops a sequence without events (its caller went away); its slot is free again."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif self.running.get(seq.slot) is seq:
            self._release(seq)

    def step(self) -> list[tuple[Sequence, Event]]:
        """Ends what was cancelled, admits what fits, runs one forward pass; every event it made, in order.
        A sequence whose own handling raises ends with Failed; the others go on. With the engine's
        `launch_ahead` (a GPU's default), the pass is launched before the tokens of the one before it are
        read into text: those come back from this call, and the device runs the new pass meanwhile (and
        while the caller handles them)."""
        if self.engine.launch_ahead:
            return self._step_ahead()
        events: list[tuple[Sequence, Event]] = []
        self._freed = set()  # slots ended in this step: their KV is saved before they are given again
        self._cancel(events)
        launched = self._launch(events)
        if launched is not None:
            logits, rows = launched
            self._accept(self.engine.sample_rows(logits, rows), {}, events, [])
        return events

    def _step_ahead(self) -> list[tuple[Sequence, Event]]:
        """The pass in flight is sampled, the next one launched with those tokens as its input, and only then
        are the tokens read into text. A token that surely ends its sequence (end of generation, its limit, a
        full context) keeps it out of the next pass; one that ends it otherwise (a stop string, a complete JSON
        value) leaves a row of the next pass unused, whose K/V, that token's, stays valid in the slot. When the
        next pass differs in make-up from the last one launched, the tokens are read first and their events
        returned before that pass (below)."""
        events: list[tuple[Sequence, Event]] = []
        self._freed = set()
        sampled: list[tuple[Sequence, int | Exception]] = []
        if self._inflight is not None:
            logits, rows = self._inflight
            self._inflight = None
            rows = [(seq, row) for seq, row in rows if self.running.get(seq.slot) is seq]
            if self._chains(rows):
                self._step_chained(logits, rows, events)
                return events
            sampled = self.engine.sample_rows(logits, rows) if rows else []
        self._cancel(events)
        sampled = [(seq, tok) for seq, tok in sampled if self.running.get(seq.slot) is seq]
        n_ctx = self.engine.n_ctx
        held, pos = set(), {}  # sequences whose token ends them or failed; where each stood when sampled
        for seq, tok in sampled:
            pos[seq] = seq.pos
            if isinstance(tok, Exception) or seq.ends_with(tok, n_ctx):
                held.add(seq)
            else:
                seq.last_token = tok  # the next pass's input (accept sets the same)
        self._admit(events)
        segments, seqs = self._plan(held)
        if self._shape(segments) != self._ahead_shape:
            # a pass of another make-up than the last (a stream joined or left, a prompt chunk) may be captured
            # or run eagerly first, tens of milliseconds of the host: the sampled tokens are read first and, when
            # they made events, go back to the caller before that pass, which the next call plans and runs (a
            # first token through the daemon waited 30-40 ms for such a capture while its DELTA sat in this
            # call's events). Passes that repeat the last one's make-up replay a captured step: launched ahead.
            self._accept(sampled, pos, events, [])
            if events:
                return events
            segments, seqs = self._plan(set())
            self._inflight = self._run_pass(segments, seqs, events)
            self._ahead_shape = self._shape(segments)
            return events
        launched = self._run_pass(segments, seqs, events)
        self._inflight = launched
        self._accept(sampled, pos, events, [] if launched is None else launched[1])
        return events

    def _chains(self, rows: list[tuple[Sequence, int]]) -> bool:
        """Whether the next pass is the pass in flight again, each row one position on, its input that pass's
        tokens wherever they are: every running sequence decodes in it (its make-up, the last launched, is
        theirs), samples on the device and goes on past its next token whatever that is; none is cancelled,
        and none waits for a slot."""
        if not rows or self.waiting or len(rows) != len(self.running) or self._ahead_shape != (1,) * len(rows):
            return False
        n_ctx = self.engine.n_ctx
        return all(seq.on_device and seq.runs_after_next(n_ctx) and not seq.cancel() for seq, _ in rows)

    def _step_chained(
        self, logits: object, rows: list[tuple[Sequence, int]], events: list[tuple[Sequence, Event]]
    ) -> None:
        """The next pass launched with the tokens of the pass in flight as its input before they are read
        (Engine.run_ahead), then those tokens read into text. A token that ends its sequence (end of generation,
        a stop string) leaves its row of the next pass unused; that row's K/V, the token's, stays valid in the
        slot."""
        seqs = [seq for seq, _ in rows]
        at = {seq: seq.pos for seq in seqs}  # the tokens each slot holds as its token is sampled
        ahead = self.engine.greedy_ahead(logits, rows)
        try:
            out, tokens = self.engine.run_ahead([Segment(seq.slot, seq.pos, (0,), True) for seq in seqs], ahead)
        except Exception as e:  # as _run_pass: a step of decode rows alone fails them all
            for seq in seqs:
                self._release(seq)
                events.append((seq, Failed(e)))
            return
        launched = [(seq, i) for i, seq in enumerate(seqs)]
        for seq in seqs:
            seq.pos += 1
        self._inflight = (out, launched)
        sampled: list[tuple[Sequence, int | Exception]] = [
            (seq, tok if tok >= 0 else ModelError("the model produced non-finite logits (corrupt weights?)"))
            for seq, tok in zip(seqs, tokens, strict=True)
        ]
        self._accept(sampled, at, events, launched)

    @staticmethod
    def _shape(segments: list[Segment]) -> tuple[int, ...]:
        return tuple(seg.n for seg in segments)

    def _cancel(self, events: list[tuple[Sequence, Event]]) -> None:
        for seq in [s for s in self.waiting if s.cancel()]:
            self.waiting.remove(seq)
            events += self._ending(seq, "cancelled")
        for seq in [s for s in self.running.values() if s.cancel()]:
            events += self._end(seq, "cancelled")

    def _launch(self, events: list[tuple[Sequence, Event]]) -> tuple[object, list[tuple[Sequence, int]]] | None:
        """Admits what fits and runs (launches, on a device) one pass of the running sequences: its logits and
        the (sequence, row) pairs to sample from them, None when nothing ran."""
        self._admit(events)
        segments, seqs = self._plan(set())
        return self._run_pass(segments, seqs, events)

    def _run_pass(
        self, segments: list[Segment], seqs: list[Sequence], events: list[tuple[Sequence, Event]]
    ) -> tuple[object, list[tuple[Sequence, int]]] | None:
        """Runs (launches) the planned pass: its logits and the (sequence, row) pairs to sample from them."""
        if not segments:
            return None
        prefill = any(s.prefilling for s in seqs)
        interrupt = (lambda: all(s.cancel() for s in seqs)) if prefill else None
        try:
            logits = self.engine.run_step(segments, interrupt)
        except Interrupted:  # every sequence of the step was cancelled
            for seq in seqs:
                events += self._end(seq, "cancelled")
            return None
        except Exception as e:
            # the prompts of the step fail (the likeliest cause: a chunk too large for the memory left); the
            # streams that only decoded go on: their slots hold what they held, and the rows this step wrote
            # past that are overwritten by their next step. A step of decode rows alone fails them all.
            failing = [seq for seq in seqs if seq.prefilling] or seqs
            for seq in failing:
                self._release(seq)
                events.append((seq, Failed(e)))
            return None
        row = 0
        rows: list[tuple[Sequence, int]] = []  # (sequence, its row of the step's logits)
        for seg, seq in zip(segments, seqs, strict=True):
            was_prefilling = seq.prefilling
            seq.pos += seg.n
            this_row = row
            row += seg.wants_logits
            if seq.prefilling:  # more of its prompt to come
                continue
            if was_prefilling:  # its prompt's end ran in this step
                seq.t_prefill = seq.t_first = time.perf_counter()
                if seq.params.max_tokens == 0:  # a prewarm: the prompt's K/V is all it wanted
                    events += self._end(seq, "length")
                    continue
            rows.append((seq, this_row))
        return logits, rows

    def _accept(
        self,
        sampled: list[tuple[Sequence, int | Exception]],
        pos: dict[Sequence, int],
        events: list[tuple[Sequence, Event]],
        ahead: list[tuple[Sequence, int]],
    ) -> None:
        """Each sequence's sampled token read into text, or the error that ends it; a sequence that ends drops
        its row of the pass launched `ahead`."""
        for seq, token_or_error in sampled:
            if self.running.get(seq.slot) is not seq:  # it failed as the pass ahead of its token was launched
                continue
            if isinstance(token_or_error, Exception):
                self._release(seq)
                events.append((seq, Failed(token_or_error)))
            else:
                try:  # a grammar or the detokenizer may raise
                    said = seq.accept(token_or_error, self.engine.n_ctx, pos.get(seq))
                except Exception as e:
                    self._release(seq)
                    events.append((seq, Failed(e)))
                else:
                    events += [(seq, ev) for ev in said]
                    if seq.done:
                        events += self._end(seq, None)
            if self.running.get(seq.slot) is not seq:
                ahead[:] = [(s, r) for s, r in ahead if s is not seq]

    # -- admission and planning -------------------------------------------------------------------------
    def _admit(self, events: list[tuple[Sequence, Event]]) -> None:
        for seq in sorted(self.waiting, key=lambda s: s.order):
            slot = self._choose_slot(seq)
            if slot is None:
                continue
            self.waiting.remove(seq)
            seq.slot = slot
            self.running[slot] = seq
            try:
                self._reuse(seq)
                if self.prepare is not None:
                    self.prepare(seq)
            except Exception as e:  # a lookup that failed oddly: the sequence fails, not the step
                self._release(seq)
                events.append((seq, Failed(e)))
                continue
            resident = self.engine.kv.resident[slot]
            seq.cached = min(common_prefix_len(resident, seq.prompt), len(seq.prompt) - 1)
            del resident[seq.cached :]
            seq.pos = seq.cached

    def _choose_slot(self, seq: Sequence) -> int | None:
        if self.limit is not None and len(self.running) >= self.limit:
            return None
        if seq.pinned_slot is not None:
            busy = seq.pinned_slot in self.running or seq.pinned_slot in self._freed
            return None if busy else seq.pinned_slot
        # not one freed in this step: the worker saves an ended sequence's KV from its slot after the step
        free = [s for s in range(self.n_slots) if s not in self.running and s not in self._freed]
        if not free:
            return None
        resident = self.engine.kv.resident
        # the longest prefix held; among equals an empty slot, else the one that ended longest ago (recent ones
        # stay warm), else the lowest
        return max(
            free, key=lambda s: (common_prefix_len(resident[s], seq.prompt), not resident[s], -self._last_used[s], -s)
        )

    def _reuse(self, seq: Sequence) -> None:
        """Copies the longest prefix of the prompt another slot holds, when longer than the own slot's."""
        resident = self.engine.kv.resident
        want = len(seq.prompt) - 1  # the prompt's last token always runs: its logits are needed
        own = min(common_prefix_len(resident[seq.slot], seq.prompt), want)
        best, best_len = None, own
        for s in range(self.n_slots):
            if s != seq.slot and (n := min(common_prefix_len(resident[s], seq.prompt), want)) > best_len:
                best, best_len = s, n
        if best is not None:
            self.engine.kv.copy_prefix(best, seq.slot, best_len)

    def _plan(self, held: set[Sequence]) -> tuple[list[Segment], list[Sequence]]:
        """Decode steps first (of the running sequences but `held`), then prompt chunks in priority order
        under the step's budget."""
        segments: list[Segment] = []
        seqs: list[Sequence] = []
        chunk = self.engine.config.prefill_chunk
        budget = chunk
        for seq in sorted(self.running.values(), key=lambda s: s.order):
            if not seq.prefilling and seq not in held:
                segments.append(Segment(seq.slot, seq.pos, (seq.last_token,), True))
                seqs.append(seq)
        for seq in sorted(self.running.values(), key=lambda s: s.order):
            if not seq.prefilling:
                continue
            ids = seq.prompt[seq.pos : seq.pos + chunk]  # the chunks it would run alone
            if len(ids) > budget:
                continue
            budget -= len(ids)
            is_last = seq.pos + len(ids) == len(seq.prompt)
            segments.append(Segment(seq.slot, seq.pos, tuple(ids), is_last))
            seqs.append(seq)
        return segments, seqs

    # -- ends -------------------------------------------------------------------------------------------
    def _end(self, seq: Sequence, reason: FinishReason | None) -> list[tuple[Sequence, Event]]:
        self._release(seq)
        return self._ending(seq, reason)

    def _ending(self, seq: Sequence, reason: FinishReason | None) -> list[tuple[Sequence, Event]]:
        """The sequence's last events (the flushed text, the Completion), or Failed when making them raises."""
        try:
            return [(seq, ev) for ev in seq.end(reason)]
        except Exception as e:
            return [(seq, Failed(e))]

    def _release(self, seq: Sequence) -> None:
        if self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            self._last_used[seq.slot] = next(self._clock)
            self._freed.add(seq.slot)
