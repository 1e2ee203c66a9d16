"""A step's inputs staged on the device, and steps captured as CUDA graphs and replayed: the token ids,
positions and per-segment rows live in buffers the graphs read (step_buffers.py), replaced only when they must
grow; every capture allocates from one pool no eager code is handed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...batch import Batch
from ...next_tokens import NextTokens
from ..numpy_backend import NumpyBackend
from .core import CupyDevice
from .rows import ROWS_MAX

# the widest output a product epilogue codes for its consumer (a row's values; the 4B's gate_up half: 9 728)
EP_WIDTH_MAX = 1 << 16

log = logging.getLogger(__name__)


@dataclass
class _Captured:
    """A decode step captured as a CUDA graph: replaying it recomputes `out` in place."""

    graph: Any  # its intermediates live in CupySteps.capture_pool, never handed to eager code
    out: Any
    version: int  # the backend's buffer version it was captured against


class CupySteps:
    """`backend`: the backend this is part of: its staging of a batch (NumpyBackend's) comes first, and its RoPE
    tables bound the positions a captured step replays for."""

    def __init__(self, dev: CupyDevice, backend: NumpyBackend) -> None:
        self.dev = dev
        self.xp = dev.xp
        self.backend = backend
        # the decode step staged last, (slot, position) a row, while the buffers hold it (replay_ahead moves it on)
        self._staged_decode: tuple[tuple[int, int], ...] | None = None
        # Every captured step allocates from this one pool, never from the default one, so nothing eager is ever
        # handed a buffer a graph writes. One pool for all of them: the steps replay one at a time on one stream,
        # and each reads only its own intermediates, written earlier in the same replay; its output stays
        # allocated while the step exists. So a step may reuse another's intermediates, and the pool holds the
        # largest step (a 4B prefill chunk of 512 tokens, ~0.2 GiB) rather than the sum of all of them. The
        # price: a replayed step's output is valid until the next step runs (the engine samples it at once).
        self.capture_pool = dev.xp.cuda.MemoryPool()
        # and one stream to capture on: CuPy's pool hands a freed block only to allocations on the stream it was
        # freed on, so a new stream per capture would share nothing
        self._capture_stream = dev.xp.cuda.Stream(non_blocking=True)

    def reserve_steps(self, max_tokens: int, max_segments: int) -> None:
        """The buffers captured steps read, sized for the engine's largest step now: grown later, each would
        make every captured step stale (its next use an eager pass and a capture, 30-50 ms of a 4B step on the
        H200), and they grew at the first step of more streams or longer chunks than any before (the token ids
        from one, a step's segments from one, the product epilogues' counters at the first chunk of over 32
        tokens), so that first burst of 8 requests through the daemon waited ~46 ms for a prefill it had
        captured. The epilogue counters take the most sets a launch makes (ROWS_MAX rows, a group of four a
        set) of EP_WIDTH_MAX values."""
        sizes = {
            "ids": max_tokens,
            "logit_rows": max_tokens,
            "segment_pos": 2 * max_segments,
            "dec": 3 * max_segments,
            "ep_cnt": -(-ROWS_MAX // 4) * EP_WIDTH_MAX // 32,
        }
        for name, size in sizes.items():
            self.dev.buffers.at_least(name, size)

    def stage_batch(self, batch: Batch) -> Any:
        ids = NumpyBackend.stage_batch(self.backend, batch)
        self.dev.segment_slots = tuple(s.slot for s in batch.segments)
        if self.dev.capturing:
            return ids
        decode = all(s.n == 1 and s.wants_logits for s in batch.segments)
        self._staged_decode = tuple((s.slot, s.pos0) for s in batch.segments) if decode else None
        n, k = len(batch.segments), len(batch.logit_rows)
        if n > 1:  # each segment's position and slot, in one copy: stage_segment points at them
            pairs = np.array([(s.pos0, s.slot) for s in batch.segments], np.int32).reshape(-1)
            self.dev.buffers.staged("segment_pos", pairs)
            # the one-token segments' rows, slots and positions, for decode_attention
            dec = [(batch.rows(j).start, s.slot, s.pos0) for j, s in enumerate(batch.segments) if s.n == 1]
            if dec:
                self.dev.buffers.staged("dec", np.array(dec, np.int32).T.reshape(-1))
        if k:
            self.dev.buffers.staged("logit_rows", batch.logit_rows.astype(np.int64))
        return ids

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        return x[self.dev.buffers.logit_rows[: len(rows)]]

    def stage_segment(self, i: int | None) -> None:
        b = self.dev.buffers
        self.dev.pos = b.step_pos if i is None else b.segment_pos[2 * i : 2 * i + 2]
        self.dev.slot = self.dev.step_slot if i is None else self.dev.segment_slots[i]

    def stage_inputs(self, ids: np.ndarray, pos0: int, slot: int = 0) -> Any:
        n = len(ids)
        self.dev.step_slot = self.dev.slot = slot
        if not self.dev.capturing:  # while capturing, the graph reads whatever the buffers hold at replay
            self._staged_decode = None  # (stage_batch says when what it staged is a decode step)
            self.dev.buffers.staged("ids", np.ascontiguousarray(ids, dtype=np.int64))
            self.dev.pos.set(np.array([pos0, slot], dtype=np.int32))
        return self.dev.buffers.ids[:n]

    def forward_step(
        self,
        steps: dict[Hashable, Any],
        key: Hashable,
        run: Callable[[], Any],
        batch: Batch,
        capturable: bool,
    ) -> Any:
        cp = self.xp
        if not (self.dev.tuning.use_graphs and capturable):
            return run()
        if max(s.pos0 + s.n for s in batch.segments) > self._rope_limit():
            return run()
        captured = steps.get(key)
        if captured is False:  # its capture failed once: eager from now on
            return run()
        if captured is None or captured.version != self.dev.buffers.version:
            out = run()  # eagerly once: compiles kernels, builds tables, computes this step
            try:
                steps[key] = self._capture(run)
            except (cp.cuda.runtime.CUDARuntimeError, NotImplementedError, RuntimeError, MemoryError) as e:
                # a pass that syncs with the host or calls a library that refuses capture, or no memory left
                # for the graph's own: it stays eager (the eager pass above has computed this step)
                log.warning("event=capture_failed key=%s: %s; running it eagerly", key, e)
                steps[key] = False
            return out
        self.stage_batch(batch)
        captured.graph.launch(stream=cp.cuda.get_current_stream())
        return captured.out

    def replay_ahead(self, steps: dict[Hashable, Any], key: Hashable, batch: Batch, ahead: NextTokens) -> Any | None:
        """advance_decode moves the staged decode step on (each row's id from `ahead`, each position one on), then
        the step replays: the host stages nothing, so this is queued behind the step before, and the device runs
        the two back to back. Only over what the buffers hold: the step staged last, as `batch` was one position
        before, its captured step current."""
        captured = steps.get(key)
        device = getattr(ahead, "device", None)
        if not isinstance(captured, _Captured) or captured.version != self.dev.buffers.version:
            return None
        if not self.dev.tuning.use_graphs:
            return None
        n = len(batch.segments)
        if device is None or device.size != n or any(s.n != 1 or not s.wants_logits for s in batch.segments):
            return None
        if self._staged_decode != tuple((s.slot, s.pos0 - 1) for s in batch.segments):
            return None
        if max(s.pos0 + 1 for s in batch.segments) > self._rope_limit():
            return None
        block = -(-n // 32) * 32
        b = self.dev.buffers
        args = (device, b.ids, np.int32(n), np.int32(n > 1), b.step_pos, b.segment_pos, b.dec)
        self.dev.op("advance_decode")((1,), (block,), args)
        self._staged_decode = tuple((s.slot, s.pos0) for s in batch.segments)
        captured.graph.launch(stream=self.xp.cuda.get_current_stream())
        return captured.out

    def _capture(self, run: Callable[[], Any]) -> _Captured:
        cp = self.xp
        pool, stream = self.capture_pool, self._capture_stream
        self.dev.capturing = True
        try:
            with cp.cuda.using_allocator(pool.malloc), stream:
                from cupy_backends.cuda.libs import cublas

                # the prefill GEMMs' stream, set while CuPy still allows it (capture_gemm.py)
                cublas.setStream(cp.cuda.device.get_cublas_handle(), stream.ptr)
                stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    out = run()
                    self.dev.chain.flush()  # products still held (chain.py) are the step's too
                finally:
                    self.dev.chain.clear()
                    graph = stream.end_capture()
        finally:
            self.dev.capturing = False
        return _Captured(graph, out, self.dev.buffers.version)

    def _rope_limit(self) -> int:
        """Positions every RoPE table covers: a replay past it must run eagerly (and grow the tables)."""
        return min((t.cos.shape[0] for t in self.backend._rope_tables.values()), default=0)
