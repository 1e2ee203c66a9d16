"""A decode step's greedy tokens, kept where the next step can read them as its input (`Backend.greedy_ahead`).

Launching ahead, the scheduler used to read a step's tokens to the host before it launched the next step, whose
input they are: the device idled for the copy and the host's bookkeeping between every two steps (~120 µs a step
of one 4B stream on the H200: 436 tok/s where the replayed steps alone make 460). A device backend leaves the
tokens on the device, where the next step reads them (`Backend.replay_ahead`), and queues their copy back; the
scheduler reads them with `tokens()` once that next step is launched.
"""

from __future__ import annotations


class NextTokens:
    """Tokens that are on the host already (a host backend's)."""

    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens

    def tokens(self) -> list[int]:
        """Each row's token, -1 for a row with a non-finite value (a device backend waits here for the copy)."""
        return self._tokens
