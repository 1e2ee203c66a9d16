"""Which products chain.py holds for one gemv1_chainc launch (one token) or gemvn_chainc launch (a step's rows), what
each waits for, and when it lets them go as their own kernels: the bookkeeping, with no GPU (test_cupy_backend.py
runs the launches on one)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from genie_workers.engine.backends.cupy.chain import CHAIN_MAX, Chain, Product

NULL = np.uint64(0)


class Buf:
    """A device array as a Product reads it: its address."""

    _next = 0x1000

    def __init__(self) -> None:
        Buf._next += 0x1000
        self.data = SimpleNamespace(ptr=Buf._next)


class Recorder(Chain):
    """A Chain whose launches are recorded, on a GPU of n_sm SMs that fits `fit` blocks an SM."""

    def __init__(self, n_sm: int = 4, fit: int = 2) -> None:
        super().__init__(SimpleNamespace(zeros=lambda n, dtype: Buf(), int32=np.int32), lambda n_token: None, n_sm)
        self.fit, self.chains, self.alone, self.kernels = fit, [], [], []

    def _blocks_fit(self, n_token: bool, threads: int, smem: int) -> int:
        return self.fit

    def _launch(self, n_token: bool, grid: int, threads: int, smem: int, table: np.ndarray) -> None:
        self.chains.append((grid, threads, smem, table.copy()))
        self.kernels.append("gemvn_chainc" if n_token else "gemv1_chainc")


def product(chain: Recorder, x8, nss=None, res=None, epilogue: int = 0, grid: int = 8, threads: int = 256, smem=1000):
    """A product of x8 (and nss, res) whose output, and with an epilogue its consumer's input, are new buffers."""
    y, ep_x8, xnew, ss = Buf(), Buf(), Buf(), Buf()
    args = (Buf(), x8, y, np.int32(64), np.int32(256), np.int32(1), nss or NULL, np.int32(8), np.float32(1e-6))
    args += (np.int32(epilogue), np.int32(0), ep_x8 if epilogue else NULL, Buf(), res or NULL, Buf(), NULL, NULL)
    args += (NULL, NULL, np.float32(0.0))  # a post-norm's weight, scale and eps
    if epilogue == 2:  # a norm: x_new and the sums of squares too
        args = (*args[:15], xnew, ss, *args[17:])
    if epilogue == 3:  # a post-norm: x_new, its weight, the layer scale and eps
        args = (*args[:15], xnew, NULL, Buf(), Buf(), np.float32(1e-6))
    kernel = lambda *a, **k: chain.alone.append(a[0])  # noqa: E731
    return Product(kernel, args, 12, grid, threads, smem), SimpleNamespace(y=y, x8=ep_x8, xnew=xnew, ss=ss)


def rows_product(chain: Recorder, x8, n: int, ss=None, res=None, epilogue: int = 0, grid: int = 8, stride: int = 64):
    """A gemvnc1 launch (rows.gemvn's arguments) of n tokens of x8 (their sums of squares ss, residual rows res),
    whose output rows lie `stride` floats apart, and with an epilogue its consumer's input, in new buffers."""
    y, ep_x8, xnew, ep_ss = Buf(), Buf(), Buf(), Buf()
    args = (Buf(), x8, np.int32(n), y, np.int64(stride), np.int32(64), np.int32(256), np.int32(1), np.int32(1))
    args += (ss or NULL, np.int32(8), np.float32(1e-6), np.int32(epilogue), np.int32(0))
    args += (ep_x8 if epilogue else NULL, Buf(), res or NULL, Buf() if epilogue == 2 else NULL)
    args += (xnew, ep_ss) if epilogue == 2 else (NULL, NULL)
    kernel = lambda *a, **k: chain.alone.append(a[0])  # noqa: E731
    p = Product(kernel, args, 14, grid, 256, 1000, n_token=True)
    return p, SimpleNamespace(y=y, x8=ep_x8, xnew=xnew, ss=ep_ss)


def test_a_layer_from_o_to_the_next_q_k_v_is_one_launch_each_product_waiting_for_its_input():
    chain = Recorder()
    attn_x8, x = Buf(), Buf()
    o, o_out = product(chain, attn_x8, res=x, epilogue=2)
    gu, gu_out = product(chain, o_out.x8, nss=o_out.ss, epilogue=1, grid=6)
    down, down_out = product(chain, gu_out.x8, res=o_out.xnew, epilogue=2)
    qk, _ = product(chain, down_out.x8, nss=down_out.ss)
    v, _ = product(chain, down_out.x8, nss=down_out.ss, grid=3, smem=3000)
    for p in (o, gu, down, qk, v):
        chain.add(p)
    assert len(chain) == 5 and not chain.chains
    chain.flush()
    assert len(chain) == 0 and not chain.alone
    ((grid, threads, smem, table),) = chain.chains
    assert (grid, threads, smem, int(table["n"])) == (8, 256, 3000, 5)
    ops = table["op"][:5]
    assert list(ops["dep"]) == [-1, 0, 1, 2, 2]  # v waits for down, not for q/k beside it
    assert list(ops["counted"]) == [1, 1, 1, 0, 0]
    assert list(ops["last_wait"]) == [0, 1, 1, 0, 1]  # v is down's last reader: it zeroes down's counter
    assert list(ops["grid"]) == [8, 6, 8, 8, 3]
    assert ops["x8"][3] == down_out.x8.data.ptr and ops["ep"]["res"][2] == o_out.xnew.data.ptr
    assert list(ops["ep"]["mode"]) == [2, 1, 2, 0, 0] and ops["ep"]["x8"][2] == down_out.x8.data.ptr
    assert list(ops["base"]) == [0] * 5  # v's 3 blocks after q/k's 8 would make 11: more than the 8 resident


def test_a_gemma_layers_post_norms_keep_the_chain_going_from_o_to_the_ple_gate():
    """Gemma 4's o and down products code their post-norm's x' and the next input in their last block (EP_POSTNORM,
    mode 3): the FFN reads o's codes, down adds to o's x' (its residual), the PLE gate reads down's codes. One
    launch; each waits for the product before it; the post-norm's weight, scale and eps reach the table."""
    chain = Recorder()
    attn_x8, x = Buf(), Buf()
    o, o_out = product(chain, attn_x8, res=x, epilogue=3)
    gu, gu_out = product(chain, o_out.x8, epilogue=1, grid=6)
    down, down_out = product(chain, gu_out.x8, res=o_out.xnew, epilogue=3)
    gate, _ = product(chain, down_out.x8, grid=2)
    for p in (o, gu, down, gate):
        chain.add(p)
    chain.flush()
    ((_, _, _, table),) = chain.chains
    ops = table["op"][:4]
    assert list(ops["dep"]) == [-1, 0, 1, 2]
    assert list(ops["ep"]["mode"]) == [3, 1, 3, 0]
    assert ops["ep"]["res"][2] == o_out.xnew.data.ptr and ops["ep"]["xnew"][2] == down_out.xnew.data.ptr
    for k, p in ((0, o), (2, down)):
        assert ops["ep"]["pw"][k] == p.arg("ep_pw") != 0 and ops["ep"]["ps"][k] == p.arg("ep_ps") != 0
        assert ops["ep"]["eps"][k] == np.float32(1e-6)


def test_a_product_that_does_not_read_its_predecessor_runs_on_the_blocks_after_it_where_they_are_resident():
    chain = Recorder(n_sm=8, fit=2)  # 16 blocks resident at once
    gu, gu_out = product(chain, Buf(), epilogue=1, grid=6)
    down, down_out = product(chain, gu_out.x8, epilogue=2, grid=8)
    qk, _ = product(chain, down_out.x8, nss=down_out.ss, grid=8)
    v, _ = product(chain, down_out.x8, nss=down_out.ss, grid=3)
    for p in (gu, down, qk, v):
        chain.add(p)
    chain.flush()
    ((grid, _, _, table),) = chain.chains
    ops = table["op"][:4]
    assert list(ops["dep"]) == [-1, 0, 1, 1] and list(ops["grid"]) == [6, 8, 8, 3]
    # down reads gate/up's code, q/k reads down's: each starts at block 0; v beside q/k on blocks 8-10
    assert list(ops["base"]) == [0, 0, 0, 8] and grid == 11


def test_a_product_reading_two_held_products_that_do_not_wait_for_each_other_sends_them_first():
    chain = Recorder()
    a, a_out = product(chain, Buf())
    b, b_out = product(chain, Buf())  # reads nothing held: a chain of two unrelated products
    chain.add(a)
    chain.add(b)
    c, _ = product(chain, a_out.y, nss=b_out.y)
    chain.add(c)
    assert len(chain.chains) == 1 and int(chain.chains[0][3]["n"]) == 2
    assert len(chain) == 1  # c waits in a chain of its own, for nothing held


def test_an_epilogue_waits_for_every_held_epilogue_before_it_as_they_share_the_group_counters():
    chain = Recorder()
    a, _ = product(chain, Buf(), epilogue=2)
    b, _ = product(chain, Buf(), epilogue=2)  # b does not read a, but shares its counters
    chain.add(a)
    chain.add(b)
    chain.flush()
    assert list(chain.chains[0][3]["op"]["dep"][:2]) == [-1, 0]


def test_a_product_of_another_block_size_or_past_chain_max_starts_a_new_chain():
    chain = Recorder()
    first, out = product(chain, Buf(), epilogue=1)
    chain.add(first)
    wide, _ = product(chain, out.x8, threads=512)
    chain.add(wide)
    assert len(chain.chains) == 0 and chain.alone == [(8,)] and len(chain) == 1  # one product: its own kernel
    chain.flush()
    x8 = Buf()
    for _ in range(CHAIN_MAX + 1):
        p, out = product(chain, x8, epilogue=1)
        chain.add(p)
        x8 = out.x8
    assert int(chain.chains[0][3]["n"]) == CHAIN_MAX and len(chain) == 1


@pytest.mark.parametrize(("n_sm", "fit"), [(4, 1), (2, 2)])
def test_blocks_that_cannot_all_be_resident_go_out_as_their_own_kernels(n_sm, fit):
    chain = Recorder(n_sm=n_sm, fit=fit)  # 8 blocks a product, 4 resident at once: a wait would never end
    a, out = product(chain, Buf(), epilogue=1)
    b, _ = product(chain, out.x8)
    chain.add(a)
    chain.add(b)
    chain.flush()
    assert not chain.chains and chain.alone == [(8,), (8,)]


def test_clear_forgets_what_is_held():
    chain = Recorder()
    a, _ = product(chain, Buf(), epilogue=1)
    chain.add(a)
    chain.clear()
    chain.flush()
    assert not chain.chains and not chain.alone


def test_a_steps_rows_chain_from_o_to_the_next_q_k_v_as_one_token_does_in_gemvn_chainc():
    """Three streams' rows: o, gate/up, down and the next q/k and v as gemvnc1 launches (rows.gemvn) hold for one
    gemvn_chainc launch, with the dependencies a token's products have, and each op's tokens, row stride and sets
    (which gemv1_chainc's ops leave 0) in the table."""
    chain = Recorder()
    attn_x8, x = Buf(), Buf()
    o, o_out = rows_product(chain, attn_x8, 3, res=x, epilogue=2)
    gu, gu_out = rows_product(chain, o_out.x8, 3, ss=o_out.ss, epilogue=1, grid=6)
    down, down_out = rows_product(chain, gu_out.x8, 3, res=o_out.xnew, epilogue=2)
    qk, _ = rows_product(chain, down_out.x8, 3, ss=down_out.ss, stride=80)  # q/k's part of a [q/k | v] output
    v, _ = rows_product(chain, down_out.x8, 3, ss=down_out.ss, grid=3, stride=80)
    for p in (o, gu, down, qk, v):
        chain.add(p)
    chain.flush()
    assert chain.kernels == ["gemvn_chainc"] and not chain.alone
    ops = chain.chains[0][3]["op"][:5]
    assert list(ops["dep"]) == [-1, 0, 1, 2, 2] and list(ops["counted"]) == [1, 1, 1, 0, 0]
    assert list(ops["n_tok"]) == [3] * 5 and list(ops["sets"]) == [1] * 5
    assert list(ops["y_stride"]) == [64] * 3 + [80] * 2
    assert list(ops["type"]) == [14] * 5 and list(ops["ep"]["mode"]) == [2, 1, 2, 0, 0]
    assert ops["nss"][1] == o_out.ss.data.ptr and ops["ep"]["res"][2] == o_out.xnew.data.ptr
    assert ops["ep"]["ss"][2] == down_out.ss.data.ptr and ops["ep"]["pw"][0] == 0  # gemvn has no post-norm


def test_one_tokens_products_and_a_steps_rows_go_out_in_launches_of_their_own():
    """A one-token product and n tokens' products are not one launch (another kernel): the n-token product sends
    what is held first, as a product of another block size does; so do the one-token products after n tokens'."""
    chain = Recorder()
    one, out = product(chain, Buf(), epilogue=1)
    chain.add(one)
    rows, rows_out = rows_product(chain, out.x8, 2, epilogue=1)
    chain.add(rows)
    assert chain.alone == [(8,)] and len(chain) == 1  # the lone one-token product went out as its own kernel
    rows2, _ = rows_product(chain, rows_out.x8, 2)
    chain.add(rows2)
    after, _ = product(chain, Buf())
    chain.add(after)
    assert chain.kernels == ["gemvn_chainc"] and int(chain.chains[0][3]["n"]) == 2 and len(chain) == 1
    one_op = chain.chains[0][3]["op"][0]
    assert one_op["n_tok"] == 2 and one_op["sets"] == 1


def test_a_one_token_products_op_leaves_the_n_token_fields_zero():
    chain = Recorder()
    a, out = product(chain, Buf(), epilogue=1)
    b, _ = product(chain, out.x8)
    chain.add(a)
    chain.add(b)
    chain.flush()
    ops = chain.chains[0][3]["op"][:2]
    assert chain.kernels == ["gemv1_chainc"]
    assert list(ops["n_tok"]) == [0, 0] and list(ops["sets"]) == [0, 0] and list(ops["y_stride"]) == [0, 0]
