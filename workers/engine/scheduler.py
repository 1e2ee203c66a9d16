"""Decides what each engine step runs: continuous batching over the KV pool's slots.

Requests wait until a slot is free (voice before background, then first come). A step runs the next
token of every sequence that is decoding plus prompt chunks of those prefilling, voice first, under a
budget of `prefill_chunk` prompt tokens a step: a new prompt never stalls the streams that decode for
longer than one chunk, and no stream waits for another's whole prompt. A prompt is cut into the same
chunks as when it runs alone (a chunk that does not fit the step's budget waits for the next step), so a
sequence gets the same numbers in a batch as alone (batch.py, Backend.stage_rows).

The scheduler only decides and keeps account; the engine runs (Engine.step): `cancel` ends what was
cancelled, `admit` gives waiting sequences their slots, `plan` says what the next pass runs, `ran` moves the
planned sequences on once it ran (or `interrupted`, `failed`), `accept` reads their sampled tokens into
events. It calls nothing of the engine's.

A new sequence gets the free slot holding the longest prefix of its prompt (an empty one, else the least
recently used one, when none does); a longer prefix held by any other slot (a shared system prompt) is
copied into it, rows instead of recomputing them; `admit`'s `prepare` (the worker's KV-store lookup) may
then load a longer saved one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Container
from dataclasses import dataclass

from genie_protocol.messages import FinishReason

from .batch import Segment
from .kv_cache import KVCache
from .sequence import Event, Failed, Sequence

Events = list[tuple[Sequence, Event]]
Rows = list[tuple[Sequence, int]]  # (sequence, its row of a pass's logits)


@dataclass(frozen=True)
class Plan:
    """What a pass runs: its segments, and the sequence of each."""

    segments: list[Segment]
    seqs: list[Sequence]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(seg.n for seg in self.segments)

    @property
    def prefill(self) -> bool:
        return any(s.prefilling for s in self.seqs)


class Scheduler:
    def __init__(self, kv: KVCache, n_ctx: int, prefill_chunk: int) -> None:
        self.kv = kv
        self.n_ctx = n_ctx
        self.prefill_chunk = prefill_chunk
        self.n_slots = kv.config.n_slots
        self.waiting: list[Sequence] = []
        self.running: dict[int, Sequence] = {}  # slot -> the sequence in it
        self._clock = itertools.count(1)
        self._last_used = [0] * self.n_slots  # the clock when each slot's sequence last ended
        self._freed: set[int] = set()  # slots whose sequence ended in the current step

    @property
    def idle(self) -> bool:
        """Nothing waits or runs."""
        return not self.waiting and not self.running

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

    def begin(self) -> None:
        """A step starts: the slots ended in it are not given again before the worker saves their KV."""
        self._freed = set()

    def cancel(self) -> Events:
        """Ends every sequence whose caller cancelled it."""
        events: Events = []
        for seq in [s for s in self.waiting if s.cancel()]:
            self.waiting.remove(seq)
            events += self._ending(seq, "cancelled")
        for seq in [s for s in self.running.values() if s.cancel()]:
            events += self._end(seq, "cancelled")
        return events

    def still_running(self, rows: Rows) -> Rows:
        return [(seq, row) for seq, row in rows if self.running.get(seq.slot) is seq]

    def chains(self, rows: Rows, last_shape: tuple[int, ...] | None) -> bool:
        """Whether the next pass is the pass in flight again, each row one position on, its input that pass's
        tokens wherever they are: every running sequence decodes in it (its make-up, `last_shape`, the last
        launched, is theirs), samples on the device and goes on past its next token whatever that is; none is
        cancelled, and none waits for a slot."""
        if not rows or self.waiting or len(rows) != len(self.running) or last_shape != (1,) * len(rows):
            return False
        return all(seq.on_device and seq.runs_after_next(self.n_ctx) and not seq.cancel() for seq, _ in rows)

    def ran(self, plan: Plan) -> tuple[Rows, Events]:
        """The planned pass ran: each sequence moves on past its segment; the rows to sample (a sequence whose
        prompt ended in it), and the events of the prewarms it completed."""
        events: Events = []
        row = 0
        rows: Rows = []
        for seg, seq in zip(plan.segments, plan.seqs, strict=True):
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
        return rows, events

    def interrupted(self, plan: Plan) -> Events:
        """Every sequence of the pass was cancelled, and the pass stopped between layers."""
        events: Events = []
        for seq in plan.seqs:
            events += self._end(seq, "cancelled")
        return events

    def failed(self, seqs: list[Sequence], error: Exception) -> Events:
        """These sequences end with `error` (a pass that failed for them)."""
        events: Events = []
        for seq in seqs:
            self._release(seq)
            events.append((seq, Failed(error)))
        return events

    def accept(self, sampled: list[tuple[Sequence, int | Exception]], pos: dict[Sequence, int], ahead: Rows) -> Events:
        """Each sequence's sampled token read into text, or the error that ends it; a sequence that ends drops
        its row of the pass launched `ahead` (`pos`: where each stood when its token was sampled)."""
        events: Events = []
        for seq, token_or_error in sampled:
            if self.running.get(seq.slot) is not seq:  # it failed as the pass ahead of its token was launched
                continue
            if isinstance(token_or_error, Exception):
                events += self.failed([seq], token_or_error)
            else:
                try:  # a grammar or the detokenizer may raise
                    said = seq.accept(token_or_error, self.n_ctx, pos.get(seq))
                except Exception as e:
                    events += self.failed([seq], e)
                else:
                    events += [(seq, ev) for ev in said]
                    if seq.done:
                        events += self._end(seq, None)
            if self.running.get(seq.slot) is not seq:
                ahead[:] = [(s, r) for s, r in ahead if s is not seq]
        return events

    # -- admission and planning -------------------------------------------------------------------------
    def admit(self, limit: int | None = None, prepare: Callable[[Sequence], None] | None = None) -> Events:
        """Waiting sequences into free slots, voice first, at most `limit` running (a hot device runs fewer;
        None: every slot); `prepare(seq)` once one has its slot, before its prefill (the worker's KV-store
        lookup). A sequence whose preparation raises fails; the others go on."""
        events: Events = []
        for seq in sorted(self.waiting, key=lambda s: s.order):
            slot = self._choose_slot(seq, limit)
            if slot is None:
                continue
            self.waiting.remove(seq)
            seq.slot = slot
            self.running[slot] = seq
            try:
                self._reuse(seq)
                if prepare is not None:
                    prepare(seq)
            except Exception as e:  # a lookup that failed oddly: the sequence fails, not the step
                events += self.failed([seq], e)
                continue
            seq.cached = min(self.kv.prefix_len(slot, seq.prompt), len(seq.prompt) - 1)
            self.kv.truncate(slot, seq.cached)
            seq.pos = seq.cached
        return events

    def _choose_slot(self, seq: Sequence, limit: int | None) -> int | None:
        if limit is not None and len(self.running) >= limit:
            return None
        if seq.pinned_slot is not None:
            busy = seq.pinned_slot in self.running or seq.pinned_slot in self._freed
            return None if busy else seq.pinned_slot
        # not one freed in this step: the worker saves an ended sequence's KV from its slot after the step
        free = [s for s in range(self.n_slots) if s not in self.running and s not in self._freed]
        if not free:
            return None
        kv = self.kv
        # the longest prefix held; among equals an empty slot, else the one that ended longest ago (recent ones
        # stay warm), else the lowest
        return max(free, key=lambda s: (kv.prefix_len(s, seq.prompt), not kv.n_held(s), -self._last_used[s], -s))

    def _reuse(self, seq: Sequence) -> None:
        """Copies the longest prefix of the prompt another slot holds, when longer than the own slot's."""
        want = len(seq.prompt) - 1  # the prompt's last token always runs: its logits are needed
        own = min(self.kv.prefix_len(seq.slot, seq.prompt), want)
        best, best_len = None, own
        for s in range(self.n_slots):
            if s != seq.slot and (n := min(self.kv.prefix_len(s, seq.prompt), want)) > best_len:
                best, best_len = s, n
        if best is not None:
            self.kv.copy_prefix(best, seq.slot, best_len)

    def plan(self, held: Container[Sequence] = ()) -> Plan:
        """Decode steps first (of the running sequences but `held`), then prompt chunks in priority order
        under the step's budget."""
        segments: list[Segment] = []
        seqs: list[Sequence] = []
        chunk = self.prefill_chunk
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
        return Plan(segments, seqs)

    # -- ends -------------------------------------------------------------------------------------------
    def _end(self, seq: Sequence, reason: FinishReason | None) -> Events:
        self._release(seq)
        return self._ending(seq, reason)

    def _ending(self, seq: Sequence, reason: FinishReason | None) -> Events:
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
