"""KV snapshots as message bodies and raw side frames (protocol/kv_messages.py), both directions.

Frames, per pool in order: its K [n, n_kv_heads, head_dim] and V [n, n_kv_heads, v_head_dim]; then for INT8,
per pool, its K and V scales [n, n_kv_heads] float32 (pools may differ in shape: Gemma 4); or all of them in one
frame, their bytes one after the other in that order (a worker's save: a frame sent without a copy costs its
sender ~25 µs on the H200's host whatever its size, and the 4B has 144 arrays). A receiver checks every
frame's size against the layout and token count before it views the bytes as arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from genie_common.kv_types import KVSnapshot

from .format import NUMPY_DTYPES, KVLayout


def layout_body(layout: KVLayout) -> dict[str, Any]:
    return {
        "dtype": layout.dtype,
        "n_layers": layout.n_layers,
        "n_kv_heads": list(layout.n_kv_heads),
        "head_dim": list(layout.head_dim),
        "v_head_dim": list(layout.v_head_dim),
        "windows": list(layout.windows),
    }


def layout_from_body(body: dict[str, Any]) -> KVLayout:
    """From a body the protocol already validated (kv_messages.LAYOUT)."""
    return KVLayout(
        body["dtype"],
        tuple(body["n_kv_heads"]),
        tuple(body["head_dim"]),
        tuple(body["v_head_dim"]),
        tuple(body["windows"]),
    )


def snapshot_frames(snap: KVSnapshot) -> list[memoryview]:
    frames = [np.ascontiguousarray(a).data for pair in zip(snap.k, snap.v, strict=True) for a in pair]
    if snap.k_scale is not None and snap.v_scale is not None:
        pairs = zip(snap.k_scale, snap.v_scale, strict=True)
        frames += [np.ascontiguousarray(a, dtype="<f4").data for pair in pairs for a in pair]
    return [f.cast("B") for f in frames]


def snapshot_from_frames(layout: KVLayout, token_ids: list[int] | np.ndarray, frames: list[Any]) -> KVSnapshot:
    """A snapshot viewing the frames' bytes; ValueError names the first frame that does not fit."""
    n = len(token_ids)
    lay = layout
    dt = np.dtype(NUMPY_DTYPES[lay.dtype])
    shapes: list[tuple[tuple[int, ...], np.dtype]] = []
    for n_kv, hd, hdv in map(lay.pool, range(lay.n_layers)):
        shapes += [((n, n_kv, hd), dt), ((n, n_kv, hdv), dt)]
    if lay.dtype == "int8":
        shapes += [((n, n_kv), np.dtype("<f4")) for n_kv in lay.n_kv_heads for _ in range(2)]
    sizes = [int(np.prod(shape)) * dtype.itemsize for shape, dtype in shapes]
    if len(frames) == 1 and len(shapes) > 1:  # every array's bytes in one frame, in the same order
        whole = memoryview(frames[0]).cast("B")
        if len(whole) != sum(sizes):
            raise ValueError(f"the KV frame has {len(whole)} bytes, the layout needs {sum(sizes)}")
        bounds = np.cumsum([0, *sizes])
        frames = [whole[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if len(frames) != len(shapes):
        raise ValueError(f"{len(frames)} KV frames, the layout needs {len(shapes)}")
    arrays = []
    for i, (frame, (shape, dtype)) in enumerate(zip(frames, shapes, strict=True)):
        buf = memoryview(frame).cast("B")
        want = int(np.prod(shape)) * dtype.itemsize
        if len(buf) != want:
            raise ValueError(f"KV frame {i} has {len(buf)} bytes, the layout needs {want}")
        arrays.append(np.frombuffer(buf, dtype=dtype).reshape(shape))
    L = lay.n_layers
    k, v = arrays[0 : 2 * L : 2], arrays[1 : 2 * L : 2]
    ks = arrays[2 * L :: 2] if lay.dtype == "int8" else None
    vs = arrays[2 * L + 1 :: 2] if lay.dtype == "int8" else None
    return KVSnapshot(lay.dtype, np.asarray(token_ids, dtype=np.int32), k, v, ks, vs)  # type: ignore[arg-type]
