"""testkit/coded_queries.py, the reference the GPU's one-token attention tests take: the query coded as
kernels/attention.cu's dec_q8_store codes it, and only where that kernel runs (one token, an INT8 pool)."""

from __future__ import annotations

import numpy as np
import pytest

from genie_workers.engine.backends.numpy_backend import NumpyBackend
from genie_workers.engine.kv_cache import KVCache, KVCacheConfig
from testkit.coded_queries import CodedQueries, dec_q8, dec_q8_block, dec_q8_ties


def test_a_block_is_coded_by_its_own_max():
    q = np.zeros((1, 1, 128), np.float32)
    q[0, 0, :32] = np.linspace(-2.0, 1.0, 32)  # block 0: max |q| 2
    q[0, 0, 32:64] = 1e-3 * np.arange(32)  # block 1: its own small scale keeps these values
    coded = dec_q8(q)
    d0 = np.float32(2.0) / np.float32(127)
    np.testing.assert_array_equal(coded[0, 0, :32], (np.rint(q[0, 0, :32] / d0) * d0).astype(np.float32))
    step1 = np.float32(0.031) / np.float32(127)
    assert np.abs(coded[0, 0, 32:64] - q[0, 0, 32:64]).max() <= 0.5001 * step1  # half a step of its own scale
    assert not coded[0, 0, 64:].any()  # zero blocks stay zero (no division by a zero scale)


def test_a_64_value_head_has_a_scale_a_quarter():
    assert (dec_q8_block(64), dec_q8_block(128), dec_q8_block(512)) == (16, 32, 32)
    q = np.zeros((1, 1, 64), np.float32)
    q[0, 0, 0] = 100.0  # the first quarter's max
    q[0, 0, 16:32] = 0.5  # the second quarter's own: coded exactly, not in steps of 100 / 127
    np.testing.assert_array_equal(dec_q8(q)[0, 0, 16:32], q[0, 0, 16:32])


def _pool(kv_dtype: str, rng: np.random.Generator):
    config = KVCacheConfig(1, 2, 64, 64, 80, n_slots=2, dtype=kv_dtype)
    kv = KVCache(config, np).layers[0]
    NumpyBackend(block_kernels=False).kv_write(
        kv, 1, 0, rng.standard_normal((60, 2, 64), dtype=np.float32), rng.standard_normal((60, 2, 64), dtype=np.float32)
    )
    return kv


@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
@pytest.mark.parametrize("n", [1, 3])
def test_only_one_token_over_an_int8_pool_is_coded(kv_dtype, n):
    rng = np.random.default_rng(5)
    kv = _pool(kv_dtype, rng)
    q = rng.standard_normal((n, 4, 64), dtype=np.float32)
    plain = NumpyBackend(block_kernels=False)
    got = CodedQueries().attention_coded(q, kv, 1, 60 - n, 0, 0.125, 0.0)
    want = plain.attention(q, kv, 1, 60 - n, 0, 0.125, 0.0)
    if n == 1 and kv_dtype == "int8":  # the kernel's numbers: the rotated query coded, then NumPy's attention
        coded = plain._attend(dec_q8(plain._rotate(q)), kv, 1, 60 - n, 0, 0.125, 0.0)
        np.testing.assert_array_equal(got, coded)
        assert not np.array_equal(got, want)
    else:
        np.testing.assert_array_equal(got, want)


def test_a_value_near_a_tie_can_be_coded_either_way():
    q = np.zeros((1, 1, 32), np.float32)
    q[0, 0, :5] = [127.0, 2.5, 3.5, 2.4998, 2.499]  # max 127: a scale of 1, so q / scale is q
    assert list(dec_q8_ties(q)) == [1, 2, 3]  # 2.499 is 1e-3 from its tie: it codes alike on any GPU
    np.testing.assert_array_equal(dec_q8(q)[0, 0, :5], [127, 2, 4, 2, 2])  # ties to even
    np.testing.assert_array_equal(dec_q8(q, (1, 2, 3))[0, 0, :5], [127, 3, 3, 3, 2])
    want = dec_q8(q)
    want[0, 0, 3] = 3  # one index: that value alone
    np.testing.assert_array_equal(dec_q8(q, (3,)), want)
    heads = np.zeros((32, 2, 1), np.float32).T  # two heads laid out otherwise (a transposed view): the same codes
    heads[0, 0] = q[0, 0]
    assert not heads.flags.c_contiguous
    np.testing.assert_array_equal(dec_q8(heads, (3,))[:, :1], want)


def test_near_ties_gives_the_pass_with_each_tie_coded_the_other_way():
    rng = np.random.default_rng(5)
    kv = _pool("int8", rng)
    plain = NumpyBackend(block_kernels=False)
    for _ in range(100):  # a query whose rotation puts a value near a tie (about 6 in 10 000 values do)
        q = rng.standard_normal((1, 4, 64), dtype=np.float32)
        ties = dec_q8_ties(plain._rotate(q))
        if len(ties):
            break
    assert len(ties)
    kept = q.copy()
    coded = CodedQueries()
    results = coded.near_ties(coded.attention_coded, q, kv, 1, 59, 0, 0.125, 0.0)
    np.testing.assert_array_equal(q, kept)  # each pass took a copy
    assert len(results) == 1 + len(ties)
    rotated = plain._rotate(q)
    for other, got in zip([(), *[(int(i),) for i in ties]], results, strict=True):
        np.testing.assert_array_equal(got, plain._attend(dec_q8(rotated, other), kv, 1, 59, 0, 0.125, 0.0))
    assert not np.array_equal(results[0], results[1])
    # a pool without codes of its query: nothing near a tie to try, one result
    f16 = _pool("f16", rng)
    assert len(coded.near_ties(coded.attention_coded, q, f16, 1, 59, 0, 0.125, 0.0)) == 1

    def twice(q, kv):  # a pass that codes two queries: a value's index would flip one of each
        return [coded.attention_coded(q, kv, 1, 59, 0, 0.125, 0.0) for _ in range(2)]

    with pytest.raises(ValueError, match="coded 2"):
        coded.near_ties(twice, q, kv)
