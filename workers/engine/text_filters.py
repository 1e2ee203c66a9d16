"""Streaming text filters applied to generated text: stop strings and hidden reasoning blocks."""

from __future__ import annotations

from genie_common.families import markups, partial_suffix


class StopMatcher:
    """Finds stop strings in streamed text, holding back only what could still become one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._pending = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string ended the text)."""
        self._pending += piece
        if not self.stops:
            out, self._pending = self._pending, ""
            return out, False
        hits = [i for i in (self._pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out = self._pending[: min(hits)]
            self._pending = ""
            return out, True
        hold = partial_suffix(self._pending, self.stops)
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out


class ThinkFilter:
    """Drops reasoning blocks from streamed text (when --think is off): each model family's markers
    (genie_common/families.py: Qwen3's `<think>…</think>`, Gemma 4's `<|channel>thought…<channel|>`)."""

    def __init__(self) -> None:
        self.pairs = tuple((m.think_open, m.think_close) for m in markups())
        self._close = ""  # the tag that ends the block we are inside; "" outside
        self._buf = ""
        self._strip_newlines = False  # after a block: drop the newlines that follow, whichever piece has them

    def feed(self, piece: str) -> str:
        self._buf += piece
        out = []
        while True:
            if self._close:
                i, n, close = self._buf.find(self._close), len(self._close), ""
            else:
                found = [(j, o, c) for o, c in self.pairs if (j := self._buf.find(o)) >= 0]
                i, opened, close = min(found) if found else (-1, "", "")
                n = len(opened)
            if i >= 0:
                if not self._close:
                    out.append(self._buf[:i])
                self._buf = self._buf[i + n :]
                self._strip_newlines = bool(self._close)
                self._close = close
                continue
            if self._strip_newlines:
                self._buf = self._buf.lstrip("\n")
                if not self._buf:
                    return "".join(out)
                self._strip_newlines = False
            tags = (self._close,) if self._close else tuple(o for o, _ in self.pairs)
            hold = partial_suffix(self._buf, tags)
            keep = self._buf[len(self._buf) - hold :] if hold else ""
            if not self._close:
                out.append(self._buf[: len(self._buf) - hold])
            self._buf = keep
            return "".join(out)

    def flush(self) -> str:
        out = "" if self._close else self._buf
        self._buf = ""
        return out
