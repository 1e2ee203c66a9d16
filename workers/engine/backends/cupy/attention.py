"""Attention on the device: the K/V write, prefill attention on the tensor cores, decode attention split over
the keys (a block a KV head and split, or from compute capability 8.0 ATT_CL blocks a KV head that also do the
q/k norm, RoPE and the K/V store: attention_dec, a cluster on 9.0, attention_decg merged through global memory on
8.x, and attention_decn, attention_decgn or attention_decb for every one-token segment of a step in one launch,
all of them the same numbers). Kernels in kernels/attention.cu and attend.cuh."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...batch import Batch
from ...kv_cache import KVCache, LayerKV
from ...model_config import LayerConfig, ModelConfig
from ..numpy_backend import NumpyBackend
from .coded import Coded
from .core import CupyDevice
from .kernels import threads_for
from .quant_consts import Q8_MAX_COLS
from .rows import x8_quads
from .tuning import ATTENTION_CLUSTER, DEC_MAX_RANKS, CupyTuning

ATTENTION_WARPS = 8  # ATT_WARPS in attention.cu

ATTENTION_MAX_HEAD_DIM = 512  # MAX_HD in attention.cu

ATTENTION_MAX_SPLITS = 32


# the GQA decode kernels (attention_gqa_G_DPL in attention.cu): (query heads per KV head, head dim / 32)
GQA_KERNELS = frozenset({(g, d) for g in (1, 2, 4, 8) for d in (2, 4, 8)} - {(8, 8)})

# attention_dec's (group, head dim / 32), DEC_SHAPES in attention.cu: a warp a query head, the key, the value
DEC_KERNELS = GQA_KERNELS - {(8, 4)} | {(2, 16)}

# the tensor-core prefill kernel (attention_prefill in attention.cu): from this many tokens a pass
PREFILL_ATTENTION_MIN_TOKENS = 16

PF_WARPS, PF_KEYS = 4, 64  # as in attention.cu (PF_WARPS: its default; attention.cu takes -DPF_WARPS)

# its instantiations (K and V head dims equal): head dim -> (name, V dims a block, keys a tile), the first whose shared
# memory fits the GPU's block taken (an RTX 30 / 40's 99 KiB takes 256's in tiles of 32 keys; 512's needs 118 KiB)
PF_FORMS: dict[int, tuple[tuple[str, int, int], ...]] = {hd: ((str(hd), hd, PF_KEYS),) for hd in (16, 32, 64, 128)}
PF_FORMS[256] = (("256", 256, PF_KEYS), ("256_k32", 256, 32))
PF_FORMS[512] = (("512", 256, 32),)  # V's dims in two blocks; its rows rotated back by fwht_rows_16 (INT8 K/V)

GQA_MAX_TOKENS = 8  # attention_gqa's queries a launch (attention.cu)


def _dec_warps(group: int, dpl: int, most: int = 16) -> int:
    """Warps a block of attention_dec_{group}_{dpl}: DEC_WARPS in attention.cu (most: DEC_MAX_WARPS)."""
    return 16 if group * dpl <= 16 and dpl <= 4 and (most >= 16 or group + 2 > 8) else 8


def _decn_warps(group: int, dpl: int, tuning: CupyTuning) -> int:
    """Warps a block of attention_decn_{group}_{dpl}: DECN_P in attention.cu."""
    return min(tuning.decn_warps, _dec_warps(group, dpl, tuning.dec_max_warps))


def _decb_shape(group: int, dpl: int, tuning: CupyTuning, ranks: int) -> tuple[int, int]:
    """attention_decb_{group}_{dpl}'s threads a block and dynamic shared memory bytes for `ranks` virtual ranks
    (DECB_RG and DecbSmem in attention.cu)."""
    p = _decn_warps(group, dpl, tuning)
    groups = max(1, (16 if dpl <= 4 else 8) // p)
    hd, warps = 32 * dpl, _dec_warps(group, dpl, tuning.dec_max_warps)
    queries = group * 4 * (8 * dpl + 4)
    per_group = warps * group * hd + 2 * warps * group
    floats = queries + group * hd + groups * per_group + ranks * (group * hd + 2 * group)
    return 32 * p * groups, 4 * floats


def dec_groups(group: int, dpl: int) -> tuple[int, int] | None:
    """attention_dec's (heads a block, head groups a KV head) for `group` query heads a KV head of 32 dpl dims: the
    group itself where a kernel takes it, else the largest kernel's group that divides it (Gemma 4 E2B's 8 heads
    of 256 dims as 2 groups of 4, of 512 as 4 of 2: attention.cu's head groups); None where none does."""
    for g in (group, 8, 4, 2, 1):
        if g <= group and group % g == 0 and (g, dpl) in DEC_KERNELS:
            return g, group // g
    return None


def _kv_mode(cfg: ModelConfig, shared: bool) -> np.int32:
    """attention_dec's kv_mode: KV_VNORM (1), KV_SHARED (2: the layer reads an earlier layer's K/V)."""
    return np.int32(int(cfg.v_norm) | 2 * int(shared))


def _slot_bytes(kv: LayerKV) -> tuple[np.int64, np.int64, np.int64]:
    """The bytes a slot spans in the layer's K, V and scale pools (the kernels' AT_SLOT, common.cuh)."""
    scale = 0 if kv.k_scale is None else kv.k_scale.strides[0]
    return np.int64(kv.k.strides[0]), np.int64(kv.v.strides[0]), np.int64(scale)


def _head_dims_problem(hd: int, hdv: int) -> str | None:
    """Why the attention kernels (attention.cu) cannot take these K/V head dims, or None."""
    if max(hd, hdv) > ATTENTION_MAX_HEAD_DIM or hd % 16 or hdv % 4:
        return (
            f"head dims {hd}/{hdv} (the GPU attention kernels take K head dims that are multiples of 16 and"
            f" V head dims that are multiples of 4, up to {ATTENTION_MAX_HEAD_DIM})"
        )
    return None


def _prefill_attention_smem(hd: int, rows: int, dv: int, keys: int) -> int:
    """attention_prefill's dynamic shared memory: Q, then the K tile, the V tile (a block's dv of V's dims) in FP16
    and their scales, or (dv == hd) the FP32 output rows that take that area after the last tile."""
    tiles = 2 * keys * (hd + 8) + 2 * keys * (dv + 8) + 4 * 2 * keys
    return 2 * rows * (hd + 8) + max(tiles, 4 * rows * (hd + 4) if dv == hd else 0)


class CupyAttention:
    """`backend`: the backend this is part of, whose NumPy compositions (on CuPy arrays) serve where these kernels do
    not, and whose RoPE tables the kernels read."""

    def __init__(self, dev: CupyDevice, backend: NumpyBackend) -> None:
        self.dev = dev
        self.xp = dev.xp
        self.backend = backend

    def _rope_table(self, lc: LayerConfig, n_pos: int) -> Any:
        """The layer's RoPE table (the backend's), covering positions [0, n_pos)."""
        return self.backend._rope_table(lc.rope_base, lc.rope_scale, lc.rope_dim, n_pos, lc.rope_freq_factors)

    def _slot_pools(self, kv: LayerKV, slot: int) -> tuple[Any, Any, Any, Any]:
        """The layer's whole K, V (and scale) pools, for a kernel that adds the staged slot's offset itself
        (AT_SLOT), so that a captured step replays for any slot; `slot` must be the one staged (steps.py)."""
        if slot != self.dev.slot:
            raise AssertionError(f"slot {slot} is not the staged one ({self.dev.slot}): stage_inputs or stage_segment")
        null = np.uint64(0)
        return (
            kv.k,
            kv.v,
            null if kv.k_scale is None else kv.k_scale,
            null if kv.v_scale is None else kv.v_scale,
        )

    def _attention_gqa(
        self, q: Any, kv: LayerKV, slot: int, window: int, scale: float, softcap: float, out: Any, group: int, dpl: int
    ) -> Any:
        """Decode attention, a block per (token, KV head) and split: attention_gqa_{group}_{dpl} in attention.cu."""
        cp = self.xp
        n, heads, hd = q.shape
        n_kv = heads // group
        blocks = n * n_kv
        n_splits = 1 if blocks >= 2 * self.dev.n_sm else min(ATTENTION_MAX_SPLITS, -(-2 * self.dev.n_sm // blocks))
        null = np.uint64(0)
        part_m = part_l = part_acc = null
        if n_splits > 1:
            part_m = cp.empty(n * heads * n_splits, dtype=cp.float32)
            part_l = cp.empty(n * heads * n_splits, dtype=cp.float32)
            part_acc = cp.empty(n * heads * n_splits * hd, dtype=cp.float32)
            self.dev.buffers.at_least("done", blocks)  # the merge counters
        self.dev.op(f"attention_gqa_{group}_{dpl}")(
            (blocks, n_splits),
            (32 * ATTENTION_WARPS,),
            (
                q,
                *self._slot_pools(kv, slot),
                out,
                part_m,
                part_l,
                part_acc,
                self.dev.buffers.done,
                np.int32(heads),
                np.int32(n_kv),
                np.int32(hd & -hd),
                self.dev.pos,
                np.int32(window),
                np.float32(scale),
                np.float32(softcap),
                *_slot_bytes(kv),
            ),
        )
        return out

    def prepare_qkv(
        self,
        qkv: Any,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Any,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Any:
        cp = self.xp
        if kv.k.dtype == cp.float32:
            return NumpyBackend.prepare_qkv(self.backend, qkv, cfg, lc, qk_norm, positions, kv, slot, pos0)
        qkv = cp.ascontiguousarray(qkv, dtype=cp.float32)
        n = qkv.shape[0]
        H, Hkv, hd, hdv = cfg.n_heads, lc.n_kv_heads, lc.head_dim, lc.v_head_dim
        table = self._rope_table(lc, int(positions[-1]) + 1)
        null = np.uint64(0)
        self.dev.op("qkv_post")(
            (n, H + 2 * Hkv),
            (threads_for(max(hd, hdv)),),
            (
                qkv,
                np.int32(H),
                np.int32(Hkv),
                np.int32(hd),
                np.int32(hdv),
                null if qk_norm is None else cp.ascontiguousarray(qk_norm),
                np.float32(cfg.rms_eps),
                np.int32(cfg.v_norm),
                table.cos,
                table.sin,
                np.int32(lc.rope_dim),
                np.int32(cfg.rope_mode == "neox"),
                self.dev.pos,
                *self._slot_pools(kv, slot),
                np.int32(hd & -hd),
                np.int32(hdv & -hdv),
                *_slot_bytes(kv),
            ),
            shared_mem=max(hd, hdv) * 4,
        )
        return qkv[:, : (H + Hkv) * hd].reshape(n, H + Hkv, hd)[:, :H]

    def self_attention(
        self,
        qkv: Any,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Any,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Any:
        """One token from compute capability 8.0: q/k norm, RoPE, the K/V store and attention in one launch of
        attention_dec (attention.cu: ATT_CL blocks per KV head, merged in distributed shared memory as a cluster on
        9.0, through global memory as attention_decg on 8.x), which also codes its output as the products' input:
        returned as Coded (coded.py), which `matmul` takes."""
        if qkv.shape[0] != 1 or not self._dec_kernel_takes(cfg, lc, kv):
            return NumpyBackend.self_attention(self.backend, qkv, cfg, lc, qk_norm, positions, kv, slot, pos0)
        return self._dec_one(qkv, cfg, lc, qk_norm, positions, kv, slot, shared=False)

    def shared_attention(
        self,
        q: Any,
        cfg: ModelConfig,
        lc: LayerConfig,
        q_norm: Any,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Any:
        """One token of a layer that reads an earlier layer's K/V: attention_dec as self_attention runs it, its
        q norm and RoPE in the same launch, nothing stored."""
        if q.shape[0] != 1 or not self._dec_kernel_takes(cfg, lc, kv):
            return NumpyBackend.shared_attention(self.backend, q, cfg, lc, q_norm, positions, kv, slot, pos0)
        return self._dec_one(q, cfg, lc, q_norm, positions, kv, slot, shared=True)

    def _dec_one(
        self,
        qkv: Any,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Any,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        shared: bool,
    ) -> Any:
        """attention_dec of one token (self_attention's, or under KV_SHARED shared_attention's)."""
        cp = self.xp
        H, Hkv, hd, hdv = cfg.n_heads, lc.n_kv_heads, lc.head_dim, lc.v_head_dim
        groups = dec_groups(H // Hkv, hd // 32)
        assert groups is not None and self.dev.family.decode_attention is not None
        group, hgs = groups
        qkv = cp.ascontiguousarray(qkv, dtype=cp.float32)
        table = self._rope_table(lc, int(positions[-1]) + 1)
        out = cp.empty((1, H * hdv), dtype=cp.float32)
        cols = H * hdv
        # the o product's input, coded by the kernel as q8_input would (returned with `out`: Coded)
        x8 = cp.empty(2 * cols + cols // 4, dtype=cp.int8) if cols <= Q8_MAX_COLS else None
        null = np.uint64(0)
        ranks = self._dec_ranks(Hkv * hgs)
        parts, done = self._dec_scratch(1, Hkv * hgs, group, hd, ranks)
        self.dev.op(f"{self.dev.family.decode_attention[0]}_{group}_{hd // 32}")(
            (Hkv * hgs * ranks,),
            (32 * _dec_warps(group, hd // 32, self.dev.tuning.dec_max_warps),),
            (
                qkv,
                *self._slot_pools(kv, slot),
                out,
                null if x8 is None else x8,
                np.int32(H),
                np.int32(Hkv),
                null if qk_norm is None else cp.ascontiguousarray(qk_norm),
                np.float32(cfg.rms_eps),
                table.cos,
                table.sin,
                np.int32(lc.rope_dim),
                np.int32(cfg.rope_mode == "neox"),
                self.dev.pos,
                np.int32(lc.sliding_window),
                np.float32(cfg.attn_scale),
                np.float32(cfg.attn_logit_softcap),
                *_slot_bytes(kv),
                parts,
                done,
                np.int32(ranks),
                np.int32(hgs),
                _kv_mode(cfg, shared),
            ),
        )
        return out if x8 is None else Coded(out, x8)

    def _dec_ranks(self, n_groups: int) -> int:
        """The blocks a head group (a KV head's query heads, or a share of them: dec_groups) of attention_dec and
        its kin, for a layer of n_groups of them, whose shares of the keys define the numbers (so a row's
        attention alone and in a step's launch use the same): on 9.0 a cluster's ATT_CL; on 8.x the tuning's, or
        with 0 (the default) as many as the SMs hold one a group's (attention_decg's 16 warps fill an SM), at
        most DEC_MAX_RANKS: an 8-SM Orin's 8 KV heads a block each, the 132-SM H100's 16 (bench/NOTES.md v26);
        of those the kernel uses a position's share where tuning.dec_rank_tasks asks."""
        if self.dev.family.paths_90:
            return ATTENTION_CLUSTER
        return self.dev.tuning.dec_ranks or max(1, min(DEC_MAX_RANKS, self.dev.n_sm // n_groups))

    def _dec_scratch(self, rows: int, n_kv: int, group: int, hd: int, ranks: int) -> tuple[Any, Any]:
        """The global merge's scratch (attention_decg and attention_decgn, 8.x; NULLs for the cluster kernels):
        the blocks' states, [rows][n_kv][ranks][group hd + 2 group] floats, and the merge counters (zero between
        launches: the kernel resets them; shared with the split-K kernels'). Sized for the most one-token rows a
        step stages (reserve_steps), so that a step of more streams does not make the captured ones stale."""
        if self.dev.family.paths_90:
            return np.uint64(0), np.uint64(0)
        rows = max(rows, self.dev.buffers.dec.size // 3)
        floats = rows * n_kv * ranks * (group * hd + 2 * group)
        return self.dev.buffers.at_least("dec_parts", floats), self.dev.buffers.at_least("done", rows * n_kv)

    def _dec_kernel_takes(self, cfg: ModelConfig, lc: LayerConfig, kv: LayerKV) -> bool:
        """attention_dec (ATT_CL blocks a KV head: a cluster on 9.0, attention_decg on 8.x) runs this layer's
        one-token attention."""
        H, Hkv, hd, hdv = cfg.n_heads, lc.n_kv_heads, lc.head_dim, lc.v_head_dim
        return (
            self.dev.family.decode_attention is not None
            and kv.k.dtype != self.xp.float32
            and hd == hdv
            and hd % 32 == 0
            and dec_groups(H // Hkv, hd // 32) is not None
            and (cfg.rope_mode != "neox" or lc.rope_dim // 2 & (lc.rope_dim // 2 - 1) == 0)
        )

    def decode_steps_by_count(self, cfg: ModelConfig, kv: KVCache) -> bool:
        """Every layer's one-token attention of a step of several streams is attention_decn (decode_attention),
        which reads each stream's slot from the staged buffer: nothing in such a step names a slot."""
        return all(self._dec_kernel_takes(cfg, lc, kv.layers[cfg.kv_pools[i]]) for i, lc in enumerate(cfg.layers))

    def mixed_steps_by_shape(self, cfg: ModelConfig, kv: KVCache) -> bool:
        """Every kernel of such a step reads its segments' slots and positions where stage_batch staged them
        (the one-token rows through attention_decn, the chunks through stage_segment's pairs), so one captured
        step serves every step of its shape (bench/NOTES.md v16)."""
        return self.decode_steps_by_count(cfg, kv)

    def decode_attention(
        self, qkv: Any, cfg: ModelConfig, lc: LayerConfig, qk_norm: Any, kv: LayerKV, batch: Batch, shared: bool = False
    ) -> Any:
        """Every one-token segment's attention_dec in one launch (attention_decn: a row of clusters a segment, or
        on 8.x attention_decgn, a row of ATT_CL blocks a KV head merged through global memory; its row, slot and
        position from the buffer stage_batch filled; from tuning.decb_min_blocks rows x KV heads attention_decb, a
        block a row and head group; all the same numbers), written into its row of the output; `shared`: a layer
        reading an earlier layer's K/V (qkv its queries alone), as shared_attention. When every row is a one-token
        segment's, the kernel also codes the output as the rows path's q8_input would (rows.q8_rows: the n-token
        layout), returned as Coded, which the o product (rows.matmul) takes."""
        cp = self.xp
        if not self._dec_kernel_takes(cfg, lc, kv):
            return None
        n_dec = sum(1 for s in batch.segments if s.n == 1)
        H, Hkv, hd = cfg.n_heads, lc.n_kv_heads, lc.head_dim
        groups = dec_groups(H // Hkv, hd // 32)
        assert groups is not None
        group, hgs = groups
        qkv = cp.ascontiguousarray(qkv, dtype=cp.float32)
        last = max(s.pos0 for s in batch.segments if s.n == 1)
        table = self._rope_table(lc, last + 1)
        out = cp.empty((qkv.shape[0], H * hd), dtype=cp.float32)
        x8 = x8_quads(cp, n_dec, H * hd) if n_dec == qkv.shape[0] > 1 and (H * hd) % 128 == 0 else None
        null = np.uint64(0)
        parts = done = null
        ranks = self._dec_ranks(Hkv * hgs)
        threads, smem = _decb_shape(group, hd // 32, self.dev.tuning, ranks)
        # a block a row and KV head (attention.cu's attention_decb) where its shared memory fits a block of this
        # GPU: the 4B's 154 KiB do on an Orin (163 KiB) and a Hopper, not on an RTX 30 / 40 (99 KiB), which takes
        # the kernel below (the same numbers)
        if n_dec * Hkv * hgs >= self.dev.tuning.decb_min_blocks and smem <= self.dev.smem_per_block:
            kernel, grid, block = self.dev.op(f"attention_decb_{group}_{hd // 32}"), (Hkv * hgs, n_dec), (threads,)
            kernel.allow_smem(smem)
        else:  # `ranks` blocks a row and KV head (a cluster, or merged through global memory)
            assert self.dev.family.decode_attention is not None
            kernel, smem = self.dev.op(f"{self.dev.family.decode_attention[1]}_{group}_{hd // 32}"), 0
            grid, block = (Hkv * hgs * ranks, n_dec), (32 * _decn_warps(group, hd // 32, self.dev.tuning),)
            parts, done = self._dec_scratch(n_dec, Hkv * hgs, group, hd, ranks)
        kernel(
            grid,
            block,
            (
                qkv,
                kv.k,
                kv.v,
                null if kv.k_scale is None else kv.k_scale,
                null if kv.v_scale is None else kv.v_scale,
                out,
                null if x8 is None else x8,
                np.int32(H),
                np.int32(Hkv),
                null if qk_norm is None else cp.ascontiguousarray(qk_norm),
                np.float32(cfg.rms_eps),
                table.cos,
                table.sin,
                np.int32(lc.rope_dim),
                np.int32(cfg.rope_mode == "neox"),
                self.dev.buffers.dec,
                np.int32(n_dec),
                np.int64(kv.k.strides[0]),
                np.int64(0 if kv.k_scale is None else kv.k_scale.strides[0] // 4),
                np.int32(lc.sliding_window),
                np.float32(cfg.attn_scale),
                np.float32(cfg.attn_logit_softcap),
                parts,
                done,
                np.int32(ranks),
                np.int32(hgs),
                _kv_mode(cfg, shared),
            ),
            smem,
        )
        return out if x8 is None else Coded(out, x8)

    def kv_write(self, kv: LayerKV, slot: int, pos0: int, k: Any, v: Any) -> None:
        cp = self.xp
        if kv.k.dtype == cp.float32:
            return NumpyBackend.kv_write(self.backend, kv, slot, pos0, k, v)
        k = cp.ascontiguousarray(k, dtype=cp.float32)
        v = cp.ascontiguousarray(v, dtype=cp.float32)
        n, heads, hd = k.shape
        hdv = v.shape[2]
        self.dev.op("kv_write")(
            (n * heads, 2),  # y: K, then V
            (threads_for(max(hd, hdv)),),
            (
                k,
                v,
                *self._slot_pools(kv, slot),
                np.int32(heads),
                np.int32(hd),
                np.int32(hdv),
                np.int32(hd & -hd),
                np.int32(hdv & -hdv),
                self.dev.pos,
                *_slot_bytes(kv),
            ),
            shared_mem=max(hd, hdv) * 4,
        )

    def _prefill_form(self, hd: int, rows: int) -> tuple[str, int, int] | None:
        """attention_prefill's form for head dim hd at `rows` query rows a block (PF_FORMS): the first that fits."""
        fits = (f for f in PF_FORMS.get(hd, ()) if _prefill_attention_smem(hd, rows, *f[1:]) <= self.dev.smem_per_block)
        return next(fits, None)

    def attention(self, q: Any, kv: LayerKV, slot: int, pos0: int, window: int, scale: float, softcap: float) -> Any:
        cp = self.xp
        if kv.k.dtype == cp.float32:
            return NumpyBackend.attention(self.backend, q, kv, slot, pos0, window, scale, softcap)
        q = cp.ascontiguousarray(q, dtype=cp.float32)
        n, heads, hd = q.shape
        n_kv, hdv = kv.k.shape[2], kv.v.shape[3]
        problem = _head_dims_problem(hd, hdv)
        if problem:
            raise ValueError(problem)
        out = cp.empty((n, heads * hdv), dtype=cp.float32)
        null = np.uint64(0)
        pools = self._slot_pools(kv, slot)
        group = heads // n_kv
        pf_rows = 16 * self.dev.tuning.pf_warps
        form = self._prefill_form(hd, pf_rows) if hd == hdv and pf_rows % group == 0 else None
        if n >= PREFILL_ATTENTION_MIN_TOKENS and form is not None:
            name, dv, keys = form
            kernel = self.dev.op(f"attention_prefill_{name}")
            smem = _prefill_attention_smem(hd, pf_rows, dv, keys)
            kernel.allow_smem(smem)
            kernel(
                (-(-n // (pf_rows // group)), n_kv, hd // dv),
                (32 * self.dev.tuning.pf_warps,),
                (
                    q,
                    *pools,
                    out,
                    np.int32(n),
                    np.int32(heads),
                    np.int32(n_kv),
                    np.int32(hd & -hd),
                    self.dev.pos,
                    np.int32(window),
                    np.float32(scale),
                    np.float32(softcap),
                    *_slot_bytes(kv),
                ),
                shared_mem=smem,
            )
            if dv < hd and kv.k_scale is not None:  # the rows' rotation back, which needs all their dims
                rows = n * heads
                self.dev.op(f"fwht_rows_{hd // 32}")((-(-rows // 8),), (256,), (out, np.int32(rows)))
            return out
        dpl = hd // 32
        if n <= GQA_MAX_TOKENS and hd == hdv and hd % 32 == 0 and (group, dpl) in GQA_KERNELS:
            return self._attention_gqa(q, kv, slot, window, scale, softcap, out, group, dpl)
        rows = n * heads
        # split-K when the rows alone cannot fill the GPU (decode): each split takes a share of the keys
        n_splits = 1 if rows >= 2 * self.dev.n_sm else min(ATTENTION_MAX_SPLITS, -(-2 * self.dev.n_sm // rows))
        part_m = part_l = part_acc = null
        if n_splits > 1:
            part_m = cp.empty(rows * n_splits, dtype=cp.float32)
            part_l = cp.empty(rows * n_splits, dtype=cp.float32)
            part_acc = cp.empty(rows * n_splits * hdv, dtype=cp.float32)
            self.dev.buffers.at_least("done", rows)  # the merge counters
        blk = hd & -hd
        self.dev.op("attention")(
            (rows, n_splits),
            (32 * ATTENTION_WARPS,),
            (
                q,
                *pools,
                out,
                part_m,
                part_l,
                part_acc,
                self.dev.buffers.done,
                np.int32(heads),
                np.int32(n_kv),
                np.int32(hd),
                np.int32(hdv),
                np.int32(blk),
                np.int32(hdv & -hdv),
                self.dev.pos,
                np.int32(window),
                np.float32(scale),
                np.float32(softcap),
                *_slot_bytes(kv),
            ),
        )
        return out
