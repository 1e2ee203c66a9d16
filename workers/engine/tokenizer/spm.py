"""SentencePiece-style tokenization as llama.cpp does it (`llm_tokenizer_spm`).

The text (spaces already escaped to U+2581) is split into characters; adjacent pairs whose
concatenation is a vocabulary token are merged, highest score first (ties: leftmost first), until
no pair merges. A final piece that is not a token is re-split along the merges that built it, and
what still has no token falls back to <0xXX> byte tokens.
"""

from __future__ import annotations

import heapq

from .vocab import Vocab


class SpmTokenizer:
    def __init__(self, vocab: Vocab) -> None:
        self.token_to_id = vocab.token_to_id
        self.scores = vocab.scores.tolist()
        self.byte_ids = [vocab.token_to_id.get(f"<0x{b:02X}>") for b in range(256)]

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        token_to_id, scores = self.token_to_id, self.scores
        # symbol i covers text[start[i] : start[i] + length[i]]; a merged-away symbol has length 0
        start = list(range(len(text)))
        length = [1] * len(text)
        prev = list(range(-1, len(text) - 1))
        nxt = list(range(1, len(text) + 1))
        nxt[-1] = -1
        rev_merge: dict[str, tuple[int, int]] = {}
        heap: list[tuple[float, int, int, int]] = []

        def try_add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            piece = text[start[left] : start[left] + length[left] + length[right]]
            token = token_to_id.get(piece)
            if token is None:
                return
            heapq.heappush(heap, (-scores[token], left, right, len(piece)))
            rev_merge[piece] = (left, right)

        for i in range(1, len(text)):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # one side was merged since this pair was queued
            length[left] += length[right]
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])

        out: list[int] = []

        def resegment(i: int) -> None:
            piece = text[start[i] : start[i] + length[i]]
            token = token_to_id.get(piece)
            if token is not None:
                out.append(token)
                return
            parts = rev_merge.get(piece)
            if parts is None:
                for byte in piece.encode("utf-8", "surrogateescape"):
                    byte_id = self.byte_ids[byte]
                    if byte_id is not None:
                        out.append(byte_id)
                return
            resegment(parts[0])
            resegment(parts[1])

        i = 0
        while i != -1:
            resegment(i)
            i = nxt[i]
        return out
