"""KV snapshots as message bodies and raw side frames (protocol/kv_messages.py), both directions.

Frames: K of all layers stacked [n_layers, n, n_kv_heads, head_dim], V likewise, then for INT8 the K and
V scales [n_layers, n, n_kv_heads] float32. A receiver checks every frame's size against the layout and
token count before it views the bytes as arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workers.engine.kv_cache import KVSnapshot

from .format import NUMPY_DTYPES, KVLayout


def layout_body(layout: KVLayout) -> dict[str, Any]:
    return {
        "dtype": layout.dtype,
        "n_layers": layout.n_layers,
        "n_kv_heads": layout.n_kv_heads,
        "head_dim": layout.head_dim,
        "v_head_dim": layout.v_head_dim,
        "windows": list(layout.windows),
    }


def layout_from_body(body: dict[str, Any]) -> KVLayout:
    """From a body the protocol already validated (kv_messages.LAYOUT)."""
    return KVLayout(
        body["dtype"],
        body["n_layers"],
        body["n_kv_heads"],
        body["head_dim"],
        body["v_head_dim"],
        tuple(body["windows"]),
    )


def snapshot_frames(snap: KVSnapshot) -> list[memoryview]:
    frames = [np.ascontiguousarray(np.stack(snap.k)).data, np.ascontiguousarray(np.stack(snap.v)).data]
    if snap.k_scale is not None and snap.v_scale is not None:
        frames += [np.stack(snap.k_scale).astype("<f4").data, np.stack(snap.v_scale).astype("<f4").data]
    return [f.cast("B") for f in frames]


def snapshot_from_frames(layout: KVLayout, token_ids: list[int] | np.ndarray, frames: list[Any]) -> KVSnapshot:
    """A snapshot viewing the frames' bytes; ValueError names the first frame that does not fit."""
    n = len(token_ids)
    lay = layout
    dt = np.dtype(NUMPY_DTYPES[lay.dtype])
    shapes: list[tuple[int, ...]] = [
        (lay.n_layers, n, lay.n_kv_heads, lay.head_dim),
        (lay.n_layers, n, lay.n_kv_heads, lay.v_head_dim),
    ]
    dtypes = [dt, dt]
    if lay.dtype == "int8":
        shapes += [(lay.n_layers, n, lay.n_kv_heads)] * 2
        dtypes += [np.dtype("<f4")] * 2
    if len(frames) != len(shapes):
        raise ValueError(f"{len(frames)} KV frames, the layout needs {len(shapes)}")
    arrays = []
    for i, (frame, shape, dtype) in enumerate(zip(frames, shapes, dtypes, strict=True)):
        buf = memoryview(frame).cast("B")
        want = int(np.prod(shape)) * dtype.itemsize
        if len(buf) != want:
            raise ValueError(f"KV frame {i} has {len(buf)} bytes, the layout needs {want}")
        arrays.append(np.frombuffer(buf, dtype=dtype).reshape(shape))
    k, v = list(arrays[0]), list(arrays[1])
    ks = list(arrays[2]) if lay.dtype == "int8" else None
    vs = list(arrays[3]) if lay.dtype == "int8" else None
    return KVSnapshot(lay.dtype, np.asarray(token_ids, dtype=np.int32), k, v, ks, vs)  # type: ignore[arg-type]
