"""What a model will hold before anything is allocated, and the context a memory budget leaves room for.

The weights are counted in the backend's own form (Backend.weight_bytes: int8 blocks with their scales on
the CPU, GGUF blocks on a GPU), the KV pool from its layout (kv_cache.py), and the scratch of one step from
the model's widths. `plan_memory` then checks them against the budget (by default the memory free now, less a
reserve) and picks the context: the one asked for, or under `auto` the model's training context when it
fits, else the largest multiple of CTX_STEP that does. A budget that cannot hold the weights is an error
before a byte is allocated.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from genie_common.errors import GenieError

MIB = 1 << 20
GIB = 1 << 30
CTX_STEP = 256  # an automatic context is a multiple of this
MIN_CTX = 256  # below this no conversation fits: the budget is refused instead


class BudgetError(GenieError):
    """The memory budget cannot hold the model (or the context asked for)."""


@dataclass(frozen=True)
class MemoryPlan:
    weights: int  # bytes, in the backend's form
    kv_per_token: int  # bytes of one position of one slot, every pool
    scratch_per_token: int  # bytes of a step's scratch per key it attends to (NumPy's attention scores)
    n_ctx: int
    n_slots: int
    scratch_fixed: int  # activations and buffers of one step, whatever its depth
    budget: int

    @property
    def kv(self) -> int:
        return self.kv_per_token * self.n_ctx * self.n_slots

    @property
    def scratch(self) -> int:
        """A step's scratch at its deepest (n_ctx keys)."""
        return self.scratch_fixed + self.scratch_per_token * self.n_ctx

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.scratch

    def line(self) -> str:
        """`weights 2.32 GiB + KV 0.34 GiB (ctx 4096 x 1) + scratch 0.21 GiB = 2.87 GiB of 7.40 budget`."""
        g = lambda n: f"{n / GIB:.2f}"  # noqa: E731
        return (
            f"weights {g(self.weights)} GiB + KV {g(self.kv)} GiB (ctx {self.n_ctx} x {self.n_slots}) + scratch "
            f"{g(self.scratch)} GiB = {g(self.total)} GiB of {g(self.budget)} budget"
        )

    def as_dict(self) -> dict[str, int]:
        """For status replies: megabytes, and the context."""
        return {
            "weights_mb": self.weights // MIB,
            "kv_mb": self.kv // MIB,
            "scratch_mb": self.scratch // MIB,
            "total_mb": self.total // MIB,
            "budget_mb": self.budget // MIB,
            "ctx": self.n_ctx,
            "slots": self.n_slots,
        }


def plan_memory(
    weights: int,
    kv_per_token: int,
    scratch_per_token: int,
    scratch: int,
    budget: int,
    n_ctx_train: int,
    ctx: int,
    n_slots: int,
) -> MemoryPlan:
    """The plan for a context of `ctx` tokens (0: auto) in `n_slots` slots within `budget` bytes: each token
    of context costs its K/V in every slot and `scratch_per_token` of a step's scratch (attention scores)."""
    room = budget - weights - scratch
    per_token = kv_per_token * n_slots + scratch_per_token
    need = f"weights {weights / GIB:.2f} GiB + scratch {scratch / GIB:.2f} GiB"
    if room <= 0 or (not ctx and room < per_token * MIN_CTX):
        raise BudgetError(
            f"a memory budget of {budget // MIB} MB cannot hold the model: {need}, and a context of "
            f"{MIN_CTX} tokens x {n_slots} slots"
        )
    if ctx:
        n_ctx = min(ctx, n_ctx_train)
        if per_token * n_ctx > room:
            raise BudgetError(
                f"a context of {n_ctx} tokens x {n_slots} slots does not fit a memory budget of {budget // MIB} MB "
                f"({need}); {room // per_token} tokens would (--ctx auto picks the largest that fits)"
            )
    else:
        fits = room // per_token
        n_ctx = n_ctx_train if fits >= n_ctx_train else fits // CTX_STEP * CTX_STEP
    return MemoryPlan(weights, kv_per_token, scratch_per_token, n_ctx, n_slots, scratch, budget)


def default_budget(free: int) -> int:
    """The memory free now, less a reserve for everything else the machine runs: a tenth, at least 256 MiB."""
    return max(0, free - max(256 * MIB, free // 10))


def available_ram() -> int:
    """Bytes of RAM the kernel says a new allocation can take (MemAvailable), else the free pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_ctx(value: str) -> int:
    """A `--ctx` value: `auto` (0) or a number of tokens."""
    if value == "auto":
        return 0
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of tokens or auto") from None
    if n < 1:
        raise argparse.ArgumentTypeError("the context must be at least 1 token (or auto)")
    return n
