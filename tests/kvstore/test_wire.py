"""KV snapshots on the worker <-> store socket: per-pool frames, for pools of one shape or several."""

from __future__ import annotations

import numpy as np
import pytest

from genie_kvstore.wire import layout_body, layout_from_body, snapshot_frames, snapshot_from_frames
from genie_protocol.kv_messages import LAYOUT
from genie_protocol.schema import validate
from testkit.draws import drawn_rng
from tests.kvstore.kv_data import assert_same, layout, mixed_layout, snapshot


@pytest.mark.parametrize("make_layout", [layout, mixed_layout], ids=["uniform", "mixed-pools"])
@pytest.mark.parametrize("dtype", ["int8", "f16", "f32"])
def test_frames_round_trip(make_layout, dtype):
    lay = make_layout(dtype)
    snap = snapshot(lay, np.arange(40), drawn_rng())
    frames = [bytes(f) for f in snapshot_frames(snap)]  # as they arrive: plain bytes
    assert len(frames) == (4 if dtype == "int8" else 2) * lay.n_layers
    assert_same(snap, snapshot_from_frames(lay, snap.token_ids, frames))
    body = validate("KV layout", layout_body(lay), LAYOUT)  # what the protocol lets through
    assert layout_from_body(body) == lay


@pytest.mark.parametrize("make_layout", [layout, mixed_layout], ids=["uniform", "mixed-pools"])
@pytest.mark.parametrize("dtype", ["int8", "f16"])
def test_one_frame_of_every_array_reads_as_the_frames_do(make_layout, dtype):
    """A worker's save sends every array's bytes in one frame (the same order): it reads back as the frames do,
    and one byte more or less is refused with the sizes."""
    lay = make_layout(dtype)
    snap = snapshot(lay, np.arange(30), np.random.default_rng(2))
    whole = b"".join(bytes(f) for f in snapshot_frames(snap))
    assert_same(snap, snapshot_from_frames(lay, snap.token_ids, [whole]))
    for bad in (whole[:-1], whole + b"\0"):
        with pytest.raises(ValueError, match=f"the KV frame has {len(bad)} bytes, the layout needs {len(whole)}"):
            snapshot_from_frames(lay, snap.token_ids, [bad])


def test_frames_that_do_not_fit_the_layout_name_the_problem():
    lay = mixed_layout("int8")
    snap = snapshot(lay, np.arange(10), drawn_rng())
    frames = [bytes(f) for f in snapshot_frames(snap)]
    with pytest.raises(ValueError, match="11 KV frames, the layout needs 12"):
        snapshot_from_frames(lay, snap.token_ids, frames[:-1])
    frames[4] = frames[4][:-1]  # pool 2's K (4 heads of 32): one byte short
    with pytest.raises(ValueError, match="KV frame 4 has 1279 bytes, the layout needs 1280"):
        snapshot_from_frames(lay, snap.token_ids, frames)


@pytest.mark.parametrize("n_layers", [18, 28, 36])  # Gemma 3 270M, Qwen3-0.6B / 1.7B, Qwen3-4B
@pytest.mark.parametrize("dtype", ["int8", "f16"])
def test_real_layer_counts_cross_the_codec_both_ways(n_layers, dtype):
    """A KV_SAVE (worker -> store) and a KV_DATA (store -> worker) of real models' layer counts decode
    whole: 4 frames a layer with INT8 were once refused by a flat 64-frame limit, silently."""
    from genie_protocol.codec import decode, encode
    from genie_protocol.kv_messages import KvData, KvSave

    lay = layout(dtype, n_layers=n_layers, n_kv_heads=1, head_dim=8)
    snap = snapshot(lay, np.arange(70), np.random.default_rng(n_layers))
    side = snapshot_frames(snap)
    save = KvSave(request_id="s1", fingerprint="ab" * 32, layout=layout_body(lay), token_ids=list(range(70)))
    for msg in (save, KvData(request_id="l1", n_tokens=70)):
        out, frames = decode([bytes(f) for f in encode(msg, side)])
        assert out == msg
        assert_same(snap, snapshot_from_frames(lay, snap.token_ids, frames))


def test_more_side_frames_than_the_type_carries_are_refused_with_the_request_id():
    from genie_protocol.codec import decode, encode
    from genie_protocol.errors import ProtocolError
    from genie_protocol.messages import Cancel

    with pytest.raises(ProtocolError, match="CANCEL carries at most 64") as e:
        decode(encode(Cancel(request_id="r7"), [b""] * 65))
    assert e.value.request_id == "r7"
