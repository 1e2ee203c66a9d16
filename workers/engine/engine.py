"""The engine: one model on one backend with a KV pool of slots, and the scheduler that decides what the
sequences in them run together (scheduler.py).

`generate` streams one prompt's answer as a plain iterator of `Delta`s ending with one `Completion` (the
CLI, tests); the worker submits `sequence`s to `scheduler` instead and calls `step`. A step is the
scheduler's plan, the pass the engine runs for it, and the scheduler's account of what that pass gave
(scheduler.py); the engine calls the scheduler, never the other way. A slot's longest common prefix with a
new prompt is reused, the rest prefilled in chunks; `cancel()` is checked before every step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Sequence_
from typing import Any

import numpy as np

from genie_common.engine_options import EngineOptions
from genie_common.errors import BackendUnsupportedError, ModelError, RequestError
from genie_common.registry import resolve_model
from genie_protocol.messages import DEFAULT_PRIORITY, Priority

from .arch.layers import Interrupted, forward, forward_batch
from .backends import BACKEND_CHOICES, select_backend
from .backends.numpy_backend import NumpyBackend
from .batch import Batch, Segment
from .captured_steps import CapturedSteps
from .chat_template import builtin_template, chat_prompt_ids
from .constraint import JsonConstraint
from .context_fit import Fitted, fit_messages
from .kv_cache import KVCache, KVCacheConfig, KVDtype, KVExport, KVSnapshot
from .memory_plan import MIB, MemoryPlan, default_budget, plan_memory
from .model import Model, ModelHeader
from .model_config import ModelConfig
from .next_tokens import NextTokens
from .sampling import SamplingParams
from .scheduler import Events, Plan, Rows, Scheduler
from .sequence import Completion, Delta, Failed, Sequence

log = logging.getLogger("genie.engine")
DEFAULT_SAMPLING = SamplingParams()
NEVER = float(np.finfo(np.float32).min)  # the logit of a token that is never sampled


def kv_cache_config(mc: ModelConfig, n_ctx: int, n_slots: int, dtype: KVDtype) -> KVCacheConfig:
    """A pool per layer that writes K/V, each shaped as that layer."""
    shapes = tuple((mc.layers[i].n_kv_heads, mc.layers[i].head_dim, mc.layers[i].v_head_dim) for i in mc.kv_layers)
    uniform = all(shape == (mc.n_kv_heads, mc.head_dim, mc.v_head_dim) for shape in shapes)
    return KVCacheConfig(
        len(shapes), mc.n_kv_heads, mc.head_dim, mc.v_head_dim, n_ctx, n_slots, dtype, None if uniform else shapes
    )


class Engine:
    def __init__(
        self,
        options: EngineOptions,
        model: Model | None = None,
        *,
        kv_dtype: KVDtype | None = None,
        launch_ahead: bool | None = None,
    ) -> None:
        """Loads `options.model`, or shares an already loaded `model` (whose backend is then used).
        `kv_dtype`: the KV pool's, where not options' (int8, or f16 with fp16_kv): f32 for references in tests.
        `launch_ahead`: each step launched before the tokens of the one before are read into text: the host's
        work on them, and its caller's, overlaps the device's next step. None: where the backend's passes run on
        a device (Backend.launches_ahead); on the CPU a pass computes as it is called and a token would only come
        a step later. Benches and tests set it."""
        if options.backend not in BACKEND_CHOICES:
            raise RequestError(f"backend must be one of {', '.join(BACKEND_CHOICES)}")
        self.options = options
        self.kv_dtype: KVDtype = kv_dtype or ("f16" if options.fp16_kv else "int8")
        if model is None:
            self.backend = select_backend(options.backend)
            path = resolve_model(options.model)
            try:
                model = Model.load(path, self.backend, self._plan_before_weights)
            except BackendUnsupportedError:
                if options.backend != "auto" or self.backend.name == "numpy":
                    raise
                log.warning("event=backend_fallback backend=%s model=%s: running it on numpy", self.backend.name, path)
                self.backend = NumpyBackend()
                model = Model.load(path, self.backend, self._plan_before_weights)
        else:  # the weights are in memory already: the budget is counted as if they were not
            self.backend = model.backend
            self.plan = self._plan(model.config, model.weight_bytes, loaded=True)
        self.model = model
        self.tokenizer = self.model.tokenizer
        mc = self.model.config
        self.n_ctx = self.plan.n_ctx
        kv_config = kv_cache_config(mc, self.n_ctx, self.plan.n_slots, self.kv_dtype)
        self.kv = KVCache(kv_config, self.backend.xp, self.backend.kv_zeros)
        # the largest step: a budget of prompt tokens over the slots, each chunk padded to its step bucket (at
        # most twice its length, or the smallest bucket), decode rows padded to nothing
        smallest = min(self.backend.step_buckets, default=1)
        most = 2 * options.prefill_chunk + smallest * self.plan.n_slots
        self.backend.reserve_steps(most, self.plan.n_slots, self.n_ctx)
        # never sampled: a text answer has no image or audio in it. Gemma 3 270M writes "<start_of_image>"
        # between sentences, which then printed as nothing glues them together ("people.But"); Google's own
        # Gemma sampler forbids these tokens too (its FORBIDDEN_TOKENS)
        banned = np.asarray(self.tokenizer.vocab.media_ids, dtype=np.int64)
        self._banned = (banned, self.backend.xp.asarray(banned)) if banned.size else None
        self._steps = CapturedSteps()  # the steps the backend captured for this engine's KV cache
        self.launch_ahead = self.backend.launches_ahead if launch_ahead is None else launch_ahead
        self.scheduler = Scheduler(self.kv, self.n_ctx, options.prefill_chunk)  # what runs in each step
        # launch_ahead: the pass launched and not yet sampled (its logits, the rows to sample), and the make-up
        # of the last pass launched ahead
        self._inflight: tuple[Any, Rows] | None = None
        self._ahead_shape: tuple[int, ...] | None = None

    @property
    def idle(self) -> bool:
        """Nothing waits or runs (a pass launched ahead for sequences that have all ended since is dropped)."""
        if self.scheduler.idle:
            self._inflight = None
            return True
        return False

    # -- steps ----------------------------------------------------------------------------------------
    def step(self, limit: int | None = None, prepare: Callable[[Sequence], None] | None = None) -> Events:
        """Ends what was cancelled, admits what fits (at most `limit` running; `prepare(seq)` once a sequence
        has its slot: Scheduler.admit), runs one forward pass; every event it made, in order. A sequence whose
        own handling raises ends with Failed; the others go on. With `launch_ahead` (a GPU's default), the pass
        is launched before the tokens of the one before it are read into text: those come back from this call,
        and the device runs the new pass meanwhile (and while the caller handles them)."""
        if self.launch_ahead:
            return self._step_ahead(limit, prepare)
        s = self.scheduler
        s.begin()
        events = s.cancel()
        events += s.admit(limit, prepare)
        launched = self._run_plan(s.plan(), events)
        if launched is not None:
            events += s.accept(self.sample_rows(*launched), {}, [])
        return events

    def _step_ahead(self, limit: int | None, prepare: Callable[[Sequence], None] | None) -> Events:
        """The pass in flight is sampled, the next one launched with those tokens as its input, and only then
        are the tokens read into text. A token that surely ends its sequence (end of generation, its limit, a
        full context) keeps it out of the next pass; one that ends it otherwise (a stop string, a complete JSON
        value) leaves a row of the next pass unused, whose K/V, that token's, stays valid in the slot. When the
        next pass differs in make-up from the last one launched, the tokens are read first and their events
        returned before that pass (below)."""
        s = self.scheduler
        s.begin()
        events: Events = []
        sampled: list[tuple[Sequence, int | Exception]] = []
        if self._inflight is not None:
            logits, rows = self._inflight
            self._inflight = None
            rows = s.still_running(rows)
            if s.chains(rows, self._ahead_shape):
                return self._step_chained(logits, rows)
            sampled = self.sample_rows(logits, rows) if rows else []
        events += s.cancel()
        sampled = [(seq, tok) for seq, tok in sampled if s.running.get(seq.slot) is seq]
        held, pos = set(), {}  # sequences whose token ends them or failed; where each stood when sampled
        for seq, tok in sampled:
            pos[seq] = seq.pos
            if isinstance(tok, Exception) or seq.ends_with(tok, self.n_ctx):
                held.add(seq)
            else:
                seq.last_token = tok  # the next pass's input (accept sets the same)
        events += s.admit(limit, prepare)
        plan = s.plan(held)
        if plan.shape != self._ahead_shape:
            # a pass of another make-up than the last (a stream joined or left, a prompt chunk) may be captured
            # or run eagerly first, tens of milliseconds of the host: the sampled tokens are read first and, when
            # they made events, go back to the caller before that pass, which the next call plans and runs (a
            # first token through the daemon waited 30-40 ms for such a capture while its DELTA sat in this
            # call's events). Passes that repeat the last one's make-up replay a captured step: launched ahead.
            events += s.accept(sampled, pos, [])
            if events:
                return events
            plan = s.plan()
            self._inflight = self._run_plan(plan, events)
            self._ahead_shape = plan.shape
            return events
        launched = self._run_plan(plan, events)
        self._inflight = launched
        events += s.accept(sampled, pos, [] if launched is None else launched[1])
        return events

    def _step_chained(self, logits: Any, rows: Rows) -> Events:
        """The next pass launched with the tokens of the pass in flight as its input before they are read
        (run_ahead), then those tokens read into text. A token that ends its sequence (end of generation, a stop
        string) leaves its row of the next pass unused; that row's K/V, the token's, stays valid in the slot."""
        s = self.scheduler
        seqs = [seq for seq, _ in rows]
        at = {seq: seq.pos for seq in seqs}  # the tokens each slot holds as its token is sampled
        ahead = self.greedy_ahead(logits, rows)
        try:
            out, tokens = self.run_ahead([Segment(seq.slot, seq.pos, (0,), True) for seq in seqs], ahead)
        except Exception as e:  # as _run_plan: a step of decode rows alone fails them all
            return s.failed(seqs, e)
        launched = [(seq, i) for i, seq in enumerate(seqs)]
        for seq in seqs:
            seq.pos += 1
        self._inflight = (out, launched)
        sampled: list[tuple[Sequence, int | Exception]] = [
            (seq, tok if tok >= 0 else ModelError("the model produced non-finite logits (corrupt weights?)"))
            for seq, tok in zip(seqs, tokens, strict=True)
        ]
        return s.accept(sampled, at, launched)

    def _run_plan(self, plan: Plan, events: Events) -> tuple[Any, Rows] | None:
        """Runs (launches) the planned pass: its logits and the (sequence, row) pairs to sample from them, None
        when nothing ran; the events of the sequences it ended go into `events`."""
        if not plan.segments:
            return None
        seqs = plan.seqs
        interrupt = (lambda: all(s.cancel() for s in seqs)) if plan.prefill else None
        try:
            logits = self.run_step(plan.segments, interrupt)
        except Interrupted:  # every sequence of the step was cancelled
            events += self.scheduler.interrupted(plan)
            return None
        except Exception as e:
            # the prompts of the step fail (the likeliest cause: a chunk too large for the memory left); the
            # streams that only decoded go on: their slots hold what they held, and the rows this step wrote
            # past that are overwritten by their next step. A step of decode rows alone fails them all.
            events += self.scheduler.failed([seq for seq in seqs if seq.prefilling] or seqs, e)
            return None
        rows, ended = self.scheduler.ran(plan)
        events += ended
        return logits, rows

    def capture_decode_steps(self) -> int:
        """The decode step of each count of streams up to the pool's slots captured now, where the backend
        captures steps and keys decode steps by their count: otherwise the first time that many streams decode
        together pays the capture (30-50 ms of a 4B step on the H200), which a burst of requests through the
        daemon met mid-stream. Runs token 0 at position 0 of empty slots and leaves them empty; returns how many
        counts it ran (a capture that fails leaves that count eager, as forward_step does at any step)."""
        if not self.backend.captures_steps or self.kv.config.dtype == "f32":
            return 0
        empty = [s for s in range(self.kv.config.n_slots) if not self.kv.n_held(s)]
        counts = range(1, len(empty) + 1)
        if not self.backend.decode_steps_by_count(self.model.config, self.kv):
            counts = range(1, min(1, len(empty)) + 1)  # keyed by their slots: only one stream's step is shared
        for k in counts:
            segments = [Segment(slot, 0, (0,), True) for slot in empty[:k]]
            for _ in range(2):  # (an engine's first step builds the RoPE tables as it runs: eager, not captured)
                self.run_step(segments, None)
                for slot in empty[:k]:
                    self.kv.clear(slot)
                if self._decode_key(segments) in self._steps:
                    break
        return len(counts)

    def _plan_before_weights(self, header: ModelHeader) -> None:
        """Model.load's hook: the plan, before any weight is allocated (a BudgetError stops the load)."""
        self.plan = self._plan(header.config, header.weight_bytes, loaded=False)
        log.info("event=memory_plan %s", self.plan.line())

    def _plan(self, mc: ModelConfig, weight_bytes: int, loaded: bool) -> MemoryPlan:
        """The memory the model, its KV pool and a step take, and the context they leave room for."""
        c = self.options
        n_slots = c.parallel or self.backend.default_parallel
        kv_per_token = kv_cache_config(mc, 1, 1, self.kv_dtype).bytes_per_token
        scratch, scratch_per_token = self.backend.scratch_bytes(mc, c.prefill_chunk, n_slots)
        free = self.backend.free_memory() + (weight_bytes if loaded else 0)
        budget = c.mem_budget_mb * MIB if c.mem_budget_mb else default_budget(free)
        return plan_memory(
            weight_bytes, kv_per_token, scratch_per_token, scratch, budget, mc.n_ctx_train, c.ctx, n_slots
        )

    # -- prompts ----------------------------------------------------------------------------------
    def chat_prompt(
        self, messages: Sequence_[Any], think: bool = False, tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        template = self.model.chat_template or builtin_template(self.model.config.arch)
        return chat_prompt_ids(self.tokenizer, template, messages, tools=tools, enable_thinking=think)

    def request_ctx(self, asked: int | None) -> int:
        """The context a request gets: what it asks for (Ollama's num_ctx), at most the engine's."""
        return self.n_ctx if asked is None else min(max(2, asked), self.n_ctx)

    def fit_chat(
        self,
        messages: Sequence_[Any],
        answer_tokens: int,
        think: bool = False,
        tools: list[dict[str, Any]] | None = None,
        n_ctx: int | None = None,
    ) -> Fitted:
        """chat_prompt, with the oldest turns dropped when the conversation does not leave room for an
        answer of `answer_tokens` (at most a quarter of the context) in the context (context_fit.py);
        `n_ctx`: the request's context (request_ctx), else the engine's."""
        n_ctx = n_ctx or self.n_ctx
        room = max(1, min(answer_tokens, n_ctx // 4))
        per_token = self.tokenizer.vocab.max_token_bytes

        def at_least(msgs: list[Any]) -> int:  # tokens the contents alone make, whatever the template adds
            return sum(len(str(m.get("content") or "").encode("utf-8", "surrogatepass")) for m in msgs) // per_token

        return fit_messages(lambda m: self.chat_prompt(m, think, tools), messages, n_ctx - room, at_least)

    def json_constraint(self, fmt: str | dict[str, Any]) -> JsonConstraint:
        """A request's output constraint: "json" (any JSON object) or a JSON schema."""
        if fmt == "json":
            return JsonConstraint(self.tokenizer, None)
        if not isinstance(fmt, dict):
            raise RequestError('format must be "json" or a JSON schema object')
        return JsonConstraint(self.tokenizer, fmt)

    def text_prompt(self, text: str, n_ctx: int | None = None) -> list[int]:
        """Refused before tokenizing when the text is surely too long for the context (`n_ctx`, else the
        engine's): a megabyte takes Gemma's tokenizer seconds, only to be refused after."""
        n_ctx = n_ctx or self.n_ctx
        at_least = len(text.encode("utf-8", "surrogatepass")) // self.tokenizer.vocab.max_token_bytes
        if at_least >= n_ctx:
            raise RequestError(f"the prompt is at least {at_least} tokens, more than the context of {n_ctx}")
        return self.tokenizer.encode(text, add_bos=None, parse_special=False)

    def _check_ids(self, ids: Sequence_[int], min_len: int, max_len: int, n_ctx: int | None = None) -> list[int]:
        ids = [int(i) for i in ids]
        if len(ids) < min_len:
            raise RequestError("the prompt is empty" if min_len == 1 else f"need at least {min_len} tokens")
        n_vocab = self.model.config.n_vocab
        bad = next((i for i in ids if not 0 <= i < n_vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the vocabulary of {n_vocab}")
        if len(ids) > max_len:
            raise RequestError(f"{len(ids)} prompt tokens do not fit the context of {n_ctx or self.n_ctx}")
        return ids

    # -- generation -------------------------------------------------------------------------------
    def _run(
        self,
        slot: int,
        ids: Sequence_[int],
        pos0: int,
        logit_rows: slice | None,
        interrupt: Callable[[], bool] | None = None,
    ) -> Any:
        """One forward pass; with `interrupt` (a prefill chunk on a backend that stops between layers) it
        may raise Interrupted, and the slot then holds what it held before."""
        # the kernels write K/V at these positions unchecked: past the cache they would corrupt other memory
        assert 0 <= pos0 and pos0 + len(ids) <= self.n_ctx, (pos0, len(ids), self.n_ctx)
        arr = np.asarray(ids, dtype=np.int64)
        m = self.model
        if not self.backend.stops_between_layers:
            interrupt = None

        def run() -> Any:
            return forward(m.config, m.weights, self.backend, self.kv, slot, arr, pos0, logit_rows, interrupt)

        out = None
        last_row = logit_rows is None or (logit_rows.start, logit_rows.stop, logit_rows.step) == (-1, None, None)
        bucket = self._bucket(len(arr), pos0) if last_row else len(arr)  # (token_nll wants every row)
        if bucket != len(arr):
            # a short chunk padded to a size whose step is captured (a chunk of any length up to it replays that
            # one step): the pad's K/V lands past what the slot holds (rows no query reads before a real token
            # overwrites them), its logits are never taken
            ids_padded = (*(int(t) for t in arr), *([int(arr[-1])] * (bucket - len(arr))))
            wants = logit_rows is not None
            padded = Batch((Segment(slot, pos0, ids_padded, wants, logit_row=len(arr) - 1),))

            def run_padded() -> Any:
                return forward_batch(m.config, m.weights, self.backend, self.kv, padded, interrupt)

            padded_key = ("step", bucket, "padded", wants)
            out = self.backend.forward_step(self._steps, padded_key, run_padded, padded, capturable=True)
        if out is None:
            # one captured step per shape, whatever the slot (the GPU backend replays it as a CUDA graph, its
            # kernels reading the slot where stage_batch staged it): decode steps and full prefill chunks, the
            # shapes that repeat
            rows = None if logit_rows is None else (logit_rows.start, logit_rows.stop, logit_rows.step)
            key = ("step", len(arr), rows)
            repeats = len(arr) in (1, self.options.prefill_chunk, *self.backend.step_buckets)
            capturable = repeats and self.kv.config.dtype != "f32"
            batch = Batch((Segment(slot, pos0, tuple(int(t) for t in arr), logit_rows is not None),))
            out = self.backend.forward_step(self._steps, key, run, batch, capturable=capturable)
        self.kv.extend(slot, ids)
        return out

    def _bucket(self, n: int, pos0: int) -> int:
        """The size a prompt chunk of n tokens at pos0 runs as: the backend's next step bucket (when it fits
        the context), else n. A chunk of exactly a bucket's size runs unpadded under a key of its own, so one
        size may be captured twice (padded and not): one key for both would save that capture."""
        if n < 2 or self.kv.config.dtype == "f32" or not self.backend.step_buckets:
            return n
        size = next((b for b in self.backend.step_buckets if n <= b <= self.options.prefill_chunk), n)
        return size if pos0 + size <= self.n_ctx else n

    def run_step(self, segments: list[Segment], interrupt: Callable[[], bool] | None) -> Any:
        """One forward pass of the scheduler's segments: logits [k, vocab], a row per segment that wants
        them (None when none does). A step of one segment takes the backend's captured steps (_run)."""
        if len(segments) == 1:
            seg = segments[0]
            return self._run(seg.slot, seg.ids, seg.pos0, slice(-1, None) if seg.wants_logits else None, interrupt)
        for seg in segments:
            assert 0 <= seg.pos0 and seg.pos0 + seg.n <= self.n_ctx, (seg.pos0, seg.n, self.n_ctx)
        if not self.backend.stops_between_layers:
            interrupt = None
        m = self.model
        # each prompt chunk padded to its step bucket as _run pads a lone one (a product of 8 rows is not one of
        # 5 in the last bits); a decode row stays as it is
        padded, bucketed = self._padded(segments)
        batch = Batch.of(padded)

        def run() -> Any:
            return forward_batch(m.config, m.weights, self.backend, self.kv, batch, interrupt)

        graphs = self.kv.config.dtype != "f32"
        # asked every step (tens of µs): a retuned backend may answer otherwise, and a step keyed by its count
        # whose attention took the slots as arguments would replay them for another set of slots
        if all(seg.n == 1 for seg in segments):
            out = self.backend.forward_step(self._steps, self._decode_key(segments), run, batch, capturable=graphs)
        else:
            # a step mixing prompt chunks with decode rows (a request's admission): captured by its shape where
            # every chunk has a bucket and the backend's steps compute the same whatever their slots and
            # positions are; else eager
            by_shape = bucketed and graphs and self.backend.mixed_steps_by_shape(m.config, self.kv)
            key = ("mixed", tuple((seg.n, seg.wants_logits) for seg in padded)) if by_shape else ("mixed",)
            out = self.backend.forward_step(self._steps, key, run, batch, capturable=by_shape)
        for seg in segments:
            self.kv.extend(seg.slot, seg.ids)
        return out

    def _decode_key(self, segments: list[Segment]) -> tuple:
        """The captured step a decode step of these one-token segments replays. One stream's is _run's; several
        streams' are one captured step for each count of streams where the backend reads their slots from a
        staged buffer, else one for each set of slots (a capture per set: streams that join and leave made a new
        one almost every time the set changed)."""
        if len(segments) == 1:
            return ("step", 1, (-1, None, None))
        by_count = self.backend.decode_steps_by_count(self.model.config, self.kv)
        return ("decode", len(segments)) if by_count else ("decode", tuple(seg.slot for seg in segments))

    def greedy_ahead(self, logits: Any, rows: Rows) -> NextTokens:
        """sample_rows for sequences that sample on the device (Sequence.on_device), their tokens left where
        `run_ahead` takes them as the next step's input; nothing waits for them here."""
        if self._banned is not None:  # finite: the argmax reads -inf as corrupt weights
            logits[..., self._banned[1]] = NEVER
        return self.backend.greedy_ahead(logits, [row for _, row in rows])

    def run_ahead(self, segments: list[Segment], ahead: NextTokens) -> tuple[Any, list[int]]:
        """The decode step of `segments` — the one-token segments of the step just launched, in its order, each
        one position on — whose ids are that step's greedy tokens `ahead` (greedy_ahead of its rows): replayed
        before the tokens are read where the backend can (Backend.replay_ahead: the device goes from one step to
        the next without waiting for the host), else run once they are. Its logits, and the tokens (-1: a row
        with non-finite logits, whose sequence ends; the step ran token 0 in its place)."""
        for seg in segments:
            assert seg.n == 1 and 0 <= seg.pos0 < self.n_ctx, (seg.n, seg.pos0, self.n_ctx)
        out = None
        if self.kv.config.dtype != "f32":
            out = self.backend.replay_ahead(self._steps, self._decode_key(segments), Batch.of(segments), ahead)
        tokens = ahead.tokens()
        ran = [Segment(seg.slot, seg.pos0, (max(tok, 0),), True) for seg, tok in zip(segments, tokens, strict=True)]
        if out is None:
            return self.run_step(ran, None), tokens
        for seg in ran:
            self.kv.extend(seg.slot, seg.ids)
        return out, tokens

    def _padded(self, segments: list[Segment]) -> tuple[list[Segment], bool]:
        """The segments with every prompt chunk padded as _run pads it alone (to its step bucket, its last token
        repeated: the pad's K/V lands past what the slot holds, its logits are never taken), and whether every
        chunk had a bucket (a shape that repeats)."""
        out, bucketed = [], True
        for seg in segments:
            size = self._bucket(seg.n, seg.pos0)
            bucketed = bucketed and (seg.n == 1 or size in self.backend.step_buckets)
            ids = (*seg.ids, *([seg.ids[-1]] * (size - seg.n)))
            out.append(Segment(seg.slot, seg.pos0, ids, seg.wants_logits, logit_row=seg.n - 1))
        return out, bucketed

    def sample_rows(self, logits: Any, rows: Rows) -> list[tuple[Sequence, int | Exception]]:
        """Each sequence's next token from its row of a step's logits (or the error that ends it)."""
        if not rows:
            return []
        if self._banned is not None:  # finite: the argmax reads -inf as corrupt weights
            logits[..., self._banned[1]] = NEVER
        host = None
        out: list[tuple[Sequence, int | Exception]] = []
        # the greedy rows' tokens in one go (a device backend: one launch, one copy back)
        greedy = [row for seq, row in rows if seq.on_device]
        on_device = dict(zip(greedy, self.backend.greedy_tokens(logits, greedy), strict=True)) if greedy else {}
        for seq, row in rows:
            try:
                if seq.on_device:
                    token = on_device[row]
                else:
                    if host is None:
                        host = self.backend.to_host(logits)
                    values = host[row].copy()
                    token = seq.sample_host(values) if np.isfinite(values).all() else -1
                if token < 0:
                    raise ModelError("the model produced non-finite logits (corrupt weights?)")
                out.append((seq, token))
            except Exception as e:  # a bad constraint, a sampler fault: this sequence ends, the others go on
                out.append((seq, e))
        return out

    def sequence(
        self,
        prompt_ids: Sequence_[int],
        params: SamplingParams = DEFAULT_SAMPLING,
        cancel: Callable[[], bool] = lambda: False,
        constraint: JsonConstraint | None = None,
        priority: Priority = DEFAULT_PRIORITY,
        slot: int | None = None,
        n_ctx: int | None = None,
    ) -> Sequence:
        """A request for the scheduler, in a context of `n_ctx` tokens (request_ctx; else the engine's); a
        prompt that is empty, out of the vocabulary or too long for it is refused (RequestError)."""
        n_ctx = n_ctx or self.n_ctx
        prompt = self._check_ids(prompt_ids, 1, n_ctx - 1, n_ctx)
        return Sequence(prompt, params, self.tokenizer, cancel, constraint, priority, slot, n_ctx)

    def generate(
        self,
        prompt_ids: Sequence_[int],
        params: SamplingParams = DEFAULT_SAMPLING,
        cancel: Callable[[], bool] = lambda: False,
        slot: int = 0,
        constraint: JsonConstraint | None = None,
    ) -> Iterator[Delta | Completion]:
        """Streams the answer to `prompt_ids` alone (in-process use: the CLI, tests); `constraint`
        (json_constraint) keeps the output valid JSON. The worker submits to `scheduler` instead."""
        seq = self.sequence(prompt_ids, params, cancel, constraint, slot=slot)
        self.scheduler.submit(seq)
        try:
            while True:
                for owner, ev in self.step():
                    if owner is not seq:
                        continue
                    if isinstance(ev, Failed):
                        raise ev.error
                    yield ev
                    if isinstance(ev, Completion):
                        return
        finally:
            self.scheduler.abort(seq)  # a caller that stopped reading: its slot is free again

    # -- scoring and KV transfer ---------------------------------------------------------------------
    def token_nll(self, ids: Sequence_[int], rows_per_pass: int = 128, slot: int = 0) -> np.ndarray:
        """NLL (nats) of ids[1:], each given all ids before it: [len(ids) - 1] float64."""
        ids = self._check_ids(ids, 2, self.n_ctx)
        self.kv.clear(slot)
        nll = np.empty(len(ids) - 1, dtype=np.float64)
        for pos in range(0, len(ids) - 1, rows_per_pass):
            chunk = ids[pos : pos + rows_per_pass]
            logits = self.backend.to_host(self._run(slot, chunk, pos, slice(None))).astype(np.float64)
            targets = np.asarray(ids[pos + 1 : pos + 1 + len(chunk)])
            logits = logits[: len(targets)]
            mx = logits.max(axis=-1)
            lse = mx + np.log(np.exp(logits - mx[:, None]).sum(axis=-1))
            nll[pos : pos + len(targets)] = lse - logits[np.arange(len(targets)), targets]
        return nll

    def export_kv(self, slot: int = 0, n_tokens: int | None = None) -> KVSnapshot:
        return self.start_export_kv(slot, n_tokens).snapshot()

    def start_export_kv(self, slot: int = 0, n_tokens: int | None = None) -> KVExport:
        """The slot's KV on its way to the host without waiting for it (a save while other streams decode)."""
        n = self.kv.n_held(slot) if n_tokens is None else n_tokens
        return self.kv.start_export(slot, n, self.backend.gather_slot, self.backend.start_to_host)

    def import_kv(self, snapshot: KVSnapshot, slot: int = 0) -> None:
        self.kv.load(slot, snapshot)
