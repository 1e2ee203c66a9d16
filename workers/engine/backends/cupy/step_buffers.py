"""The device buffers captured steps read: a step's staged inputs, and the counters and scratch its kernels share.

A CUDA graph holds their addresses, so a buffer too small is replaced, never resized, and every step captured before
it is then stale: `version` moves on, and forward_step captures that step again. Other things the graphs read (a
RoPE table, a kernel module) say so through `replaced`. One owner, so what makes a capture stale is counted in one
place."""

from __future__ import annotations

from typing import Any

import numpy as np


class StepBuffers:
    def __init__(self, xp: Any) -> None:
        self._xp = xp
        self.version = 0
        self.ids = xp.zeros(1, dtype=xp.int64)  # the step's token ids
        # the step's first position and K/V slot (the kernels read them where CupyDevice.pos points: AT_SLOT in
        # common.cuh); never replaced
        self.step_pos = xp.zeros(2, dtype=xp.int32)
        self.segment_pos = xp.zeros(2, dtype=xp.int32)  # a step of several segments: each one's (pos, slot)
        self.logit_rows = xp.zeros(1, dtype=xp.int64)  # the rows whose logits a step returns (take_rows)
        self.dec = xp.zeros(3, dtype=xp.int32)  # a step's one-token segments: rows, slots, positions
        # counters, zero between launches (the kernel that counts resets them): split-K attention's and the global
        # merge's (attention.py), the product epilogues' groups (quant.cu)
        self.done = xp.zeros(1024, dtype=xp.int32)
        self.ep_cnt = xp.zeros(1024, dtype=xp.int32)
        self.dec_parts = xp.zeros(0, dtype=xp.float32)  # attention_decg's blocks' states

    def at_least(self, name: str, size: int, spare: int = 0) -> Any:
        """Buffer `name` with at least `size` elements: itself, or (stale captures) a new one of zeros with
        max(size, spare)."""
        buffer = getattr(self, name)
        if buffer.size < size:
            buffer = self._xp.zeros(max(size, spare), dtype=buffer.dtype)
            setattr(self, name, buffer)
            self.version += 1
        return buffer

    def staged(self, name: str, values: np.ndarray) -> Any:
        """`values` copied into the front of buffer `name` (twice as long when short)."""
        buffer = self.at_least(name, values.size, 2 * getattr(self, name).size)
        buffer[: values.size].set(values)
        return buffer

    def replaced(self) -> None:
        """Something else captured steps read was replaced: every step captured so far is stale."""
        self.version += 1
