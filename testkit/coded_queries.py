"""The GPU's one-token attention on an INT8 pool codes each query to int8 before its scores (kernels/attention.cu,
dec_q8_store: llama.cpp's q8_1 of the query, 4 products an instruction with dp4a). Its NumPy reference here: the
same codes from the same rotated query, so a test bounds the kernel's arithmetic, not the coding's own error
(bench/attn_q8_fidelity.py measures that on real models)."""

from __future__ import annotations

from typing import Any

import numpy as np

from genie_workers.engine.backends.numpy_backend import NumpyBackend


def dec_q8_block(head_dim: int) -> int:
    """Values a scale: 32, or a quarter of a 64-value head (a quad of lanes holds a quarter)."""
    return min(32, head_dim // 4)


def dec_q8(q: np.ndarray) -> np.ndarray:
    """q [..., hd] (rotated as the pool's rows are) as int8 codes times their block's scale (max |q| / 127 in
    float32, codes round(q / scale) with ties to even), back in float32."""
    hd = q.shape[-1]
    blocks = q.astype(np.float32).reshape(*q.shape[:-1], -1, dec_q8_block(hd))
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127.0)
    codes = np.rint(np.divide(blocks, scale, out=np.zeros_like(blocks), where=scale > 0))
    return (codes * scale).astype(np.float32).reshape(q.shape)


class CodedQueries(NumpyBackend):
    """The NumPy backend (float32 weights, its Python attention) whose one-token attention codes the query where
    the pool is INT8, as the GPU's attention_dec and its kin do; a pass of several rows keeps float queries, as
    the GPU's prompt kernels do."""

    def __init__(self) -> None:
        super().__init__(block_kernels=False)
        self._one_token = False

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
            q = dec_q8(q)
        return super()._attend(q, kv, slot, pos0, window, scale, softcap)
