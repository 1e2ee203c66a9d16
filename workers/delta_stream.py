"""How the worker streams one request's text: the first piece at once, then at most one DELTA every
`interval_s`, and a sentence end at once.

Every message costs the worker, the daemon and the client a few context switches and some tens of
microseconds each, all taken from the cores that decode. A GPU decodes a token every few milliseconds, a
tiny model on a CPU every few hundred microseconds: sending each token on its own made the daemon hop cost
~200 µs a token on a 2-core machine. Coalescing the tokens of a few milliseconds into one DELTA (vLLM's
`stream_interval` does the same by token count) keeps the first token and every sentence boundary
immediate — what a voice pipeline waits on — and delays any other text by at most one interval plus one
decode step. The text comes typed (output_parser.py has read the model's markup): a DELTA holds one kind,
content or reasoning, and a tool call goes in a DELTA of its own, after the text before it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from genie_common.events import Event, Piece, ToolCall
from genie_protocol.messages import Delta

# a piece of text that ends a sentence (for TTS): terminal punctuation, closing quotes/brackets, or a newline
SENTENCE_END = re.compile(r"([.!?…。！？][\"'”’)\]]*|\n)\s*$")


class DeltaStream:
    def __init__(
        self,
        request_id: str,
        send: Callable[[Delta], None],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request_id = request_id
        self.send = send
        self.interval_s = interval_s
        self.clock = clock
        self.text = ""
        self.kind = "content"  # what the pending text is
        self.token_ids: list[int] = []
        self.last_sent: float | None = None  # None: nothing sent yet, the next piece goes at once

    def add(self, text: str, token_ids: list[int], kind: str = "content") -> None:
        if text and kind != self.kind:
            if self.text:  # a DELTA holds one kind: what is pending of the other goes first
                self.flush()
            self.kind = kind
        self.text += text
        self.token_ids.extend(token_ids)
        if not self.text and not self.token_ids:
            return
        end = self.kind == "content" and bool(SENTENCE_END.search(self.text))
        if end or self.last_sent is None or self.clock() - self.last_sent >= self.interval_s:
            self._send(end)

    def events(self, events: list[Event], token_ids: list[int]) -> None:
        """The parser's events for a piece of the answer (the tokens it came from ride with the text)."""
        for ev in events:
            if isinstance(ev, Piece):
                self.add(ev.text, token_ids, ev.kind)
                token_ids = []
            else:
                self.call(ev)
        if token_ids:
            self.add("", token_ids)

    def call(self, call: ToolCall) -> None:
        """A complete tool call: the text before it first, then a DELTA of its own, at once."""
        self.flush()
        tool_calls = [{"name": call.name, "arguments": _carried(call.arguments)}]
        self.send(Delta(request_id=self.request_id, text="", tool_calls=tool_calls))
        self.last_sent = self.clock()

    def flush(self) -> None:
        """Sends what is pending (before DONE or ERROR)."""
        if self.text or self.token_ids:
            self._send(self.kind == "content" and bool(SENTENCE_END.search(self.text)))

    def _send(self, sentence_end: bool) -> None:
        delta = Delta(
            request_id=self.request_id,
            text=self.text,
            token_ids=self.token_ids,
            sentence_end=sentence_end,
            kind=self.kind,
        )
        self.send(delta)
        self.text, self.token_ids = "", []
        self.last_sent = self.clock()


def _carried(value: Any) -> Any:
    """A tool call's arguments as msgpack can carry them: an integer past 64 bits (JSON has no limit, and a
    model may write one) becomes the float JSON readers make of it, instead of a DELTA that cannot be sent."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 64) else float(value)
    if isinstance(value, dict):
        return {k: _carried(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_carried(v) for v in value]
    return value
