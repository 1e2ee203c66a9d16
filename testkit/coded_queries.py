"""The GPU's one-token attention on an INT8 pool codes each query to int8 before its scores (kernels/attention.cu,
dec_q8_store: llama.cpp's q8_1 of the query, 4 products an instruction with dp4a). Its NumPy reference here: the
same codes from the same rotated query, so a test bounds the kernel's arithmetic, not the coding's own error
(bench/attn_q8_fidelity.py measures that on real models)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from genie_workers.engine.backends.numpy_backend import NumpyBackend


def dec_q8_block(head_dim: int) -> int:
    """Values a scale: 32, or a quarter of a 64-value head (a quad of lanes holds a quarter)."""
    return min(32, head_dim // 4)


# How near a .5 tie (in steps of a code) a value's q / scale may lie and code the other way on the GPU: its rotated
# query is a few roundings from NumPy's (norm, RoPE and the pool's rotation in float32, in another order), by
# estimate up to ~6e-5 of a step near 127 steps. One code apart can move a 64-value head's output past the tests'
# bound where K has an outlier channel (bench/NOTES.md, session 2026-12-08); each value taken either way also
# loosens the bound in its direction, so the margin is kept to a few times the estimate
TIE = 3e-4


def _steps(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q [..., hd] in blocks of a scale: (q / scale, scale), 0 where a block is all zeros."""
    blocks = q.astype(np.float32).reshape(*q.shape[:-1], -1, dec_q8_block(q.shape[-1]))
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127.0)
    return np.divide(blocks, scale, out=np.zeros_like(blocks), where=scale > 0), scale


def dec_q8(q: np.ndarray, other: Sequence[int] = ()) -> np.ndarray:
    """q [..., hd] (rotated as the pool's rows are) as int8 codes times their block's scale (max |q| / 127 in
    float32, codes round(q / scale) with ties to even), back in float32. `other`: flat indices of values coded on
    the other side of their .5 (dec_q8_ties': the code a kernel an ulp away may take)."""
    steps, scale = _steps(q)
    codes = np.ascontiguousarray(np.rint(steps))  # flat below is a view of it, whatever q's layout
    flat, whole = codes.reshape(-1), steps.reshape(-1)
    for i in other:
        lower = np.floor(whole[i])
        flat[i] = lower + 1 if flat[i] == lower else lower
    return (codes * scale).astype(np.float32).reshape(q.shape)


def dec_q8_ties(q: np.ndarray) -> np.ndarray:
    """Flat indices of q's values that lie within TIE of a .5 between two codes."""
    steps, _ = _steps(q)
    return np.flatnonzero(np.abs(steps - np.floor(steps) - 0.5) < TIE)


class CodedQueries(NumpyBackend):
    """The NumPy backend (float32 weights, its Python attention) whose one-token attention codes the query where
    the pool is INT8, as the GPU's attention_dec and its kin do; a pass of several rows keeps float queries, as
    the GPU's prompt kernels do."""

    def __init__(self) -> None:
        super().__init__(block_kernels=False)
        self._one_token = False
        self._other: tuple[int, ...] = ()
        self._ties: list[int] = []  # dec_q8_ties of the query coded last
        self._coded_passes = 0  # queries coded since near_ties began

    def near_ties(self, op: Callable[..., Any], *args: Any) -> list[Any]:
        """op(*args), a one-token pass through this backend (its query coded once), then again with each value
        near a tie coded the other way, one at a time: the kernel's result is one of these (a test bounds the
        nearest). Each call gets copies of the arrays in args (a pass may rotate its query in place)."""

        def run() -> Any:
            return op(*(a.copy() if isinstance(a, np.ndarray) else a for a in args))

        self._ties, self._coded_passes = [], 0
        results = [run()]
        if self._coded_passes > 1:  # a flat index of one query's values would flip a value of each
            raise ValueError(f"near_ties takes a pass that codes one query; this one coded {self._coded_passes}")
        for i in list(self._ties):
            self._other = (i,)
            try:
                results.append(run())
            finally:
                self._other = ()
        return results

    def self_attention(self, qkv: Any, *args: Any) -> Any:
        return self._coded(qkv.shape[0] == 1, NumpyBackend.self_attention, qkv, *args)

    def shared_attention(self, q: Any, *args: Any) -> Any:
        return self._coded(q.shape[0] == 1, NumpyBackend.shared_attention, q, *args)

    def _coded(self, one_token: bool, op: Any, *args: Any) -> Any:
        self._one_token = one_token
        try:
            return op(self, *args)
        finally:
            self._one_token = False

    def attention_coded(self, q: Any, kv: Any, slot: int, pos0: int, window: int, scale: float, softcap: float) -> Any:
        """attention() of one token's q as the one-token kernels compute it (q coded where the pool is INT8)."""
        return self._coded(q.shape[0] == 1, NumpyBackend.attention, q, kv, slot, pos0, window, scale, softcap)

    def _attend(self, q, kv, slot, pos0, window, scale, softcap):  # type: ignore[no-untyped-def]
        if self._one_token and kv.k_scale is not None:
            self._ties = [int(i) for i in dec_q8_ties(q)]
            self._coded_passes += 1
            q = dec_q8(q, self._other)
        return super()._attend(q, kv, slot, pos0, window, scale, softcap)
