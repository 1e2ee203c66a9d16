"""When saved KV is worth it: hydrating a prefix must cost less than prefilling it again on this backend.

On a CPU a 10-token voice turn takes longer to prefill (~20 ms on 2 cores) than to read back from the
store (~2 ms), so it is saved; on an H200, prefilling 64 tokens takes about a millisecond and a lookup
about as long, so only longer prefixes are. The policy learns both costs as the worker runs: prefill time
per token from each turn, a lookup's fixed cost from the misses, its cost per token from the hits. Until
it has seen a prefill (a new worker's first turn) it looks up any length: a lookup that finds nothing
costs about 2 ms. Without a conversation id, only whole 64-token chunks can be found (store.chunk_chain).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .store import CHUNK_TOKENS

LOOKUP_FIXED_S = 0.002  # a lookup's round trip before one is measured: a message each way and a directory look
SMOOTHING = 0.2  # weight of the newest measurement in each running average


@dataclass
class ReusePolicy:
    prefill_s_per_token: float | None = None  # None: not measured yet
    lookup_fixed_s: float = LOOKUP_FIXED_S
    hydrate_s_per_token: float = 0.0

    def observe_prefill(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0 and seconds > 0:
            self.prefill_s_per_token = _average(self.prefill_s_per_token, seconds / n_tokens)

    def observe_lookup(self, n_tokens: int, seconds: float) -> None:
        """A lookup that loaded `n_tokens` (0: a miss) in `seconds`, the load into the cache included."""
        if seconds <= 0:
            return
        if n_tokens == 0:
            self.lookup_fixed_s = _average(self.lookup_fixed_s, seconds)
        else:
            per_token = max(0.0, seconds - self.lookup_fixed_s) / n_tokens
            self.hydrate_s_per_token = _average(self.hydrate_s_per_token or None, per_token)

    @property
    def min_tokens(self) -> int:
        """The shortest prefix whose hydration beats recomputing it: n * prefill > fixed + n * hydrate."""
        p = self.prefill_s_per_token
        if p is None:
            return 1
        gain = p - self.hydrate_s_per_token
        if gain <= 0:
            return 1 << 30  # reading back is slower than recomputing at any length
        return max(1, math.floor(self.lookup_fixed_s / gain) + 1)

    def shortest(self, conv_id: str | None) -> int:
        """The fewest tokens worth saving or hydrating; without a conversation id, a whole chunk."""
        return max(self.min_tokens, 1 if conv_id else CHUNK_TOKENS)

    def worth_saving(self, n_tokens: int, conv_id: str | None) -> bool:
        return n_tokens >= self.shortest(conv_id)

    def worth_looking_up(self, n_prompt: int, held: int, conv_id: str | None) -> bool:
        """At most n_prompt - 1 tokens can be reused (the last one is run for its logits), and only what
        goes beyond the `held` tokens already in the cache is gained."""
        return n_prompt - 1 > held and n_prompt - 1 >= self.shortest(conv_id)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
