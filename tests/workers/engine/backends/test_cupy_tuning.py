"""The CuPy backend's tuning as one frozen object (no GPU needed): what it compiles in, what it refuses, and
that a knob can no longer be flipped as a backend attribute (it would be ignored)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from genie_workers.engine.backends.cupy import OPS_SOURCES, QUANT_SOURCES, CupyBackend, CupyTuning, kernel_source
from genie_workers.engine.backends.cupy.core import CupyDevice
from genie_workers.engine.backends.cupy.family import AMPERE, HOPPER, OLDER, family_of
from genie_workers.engine.backends.cupy.products import CupyProducts
from genie_workers.engine.backends.cupy.tuning import DEFINES


def test_defaults_compile_in_nothing_and_a_changed_size_is_a_define():
    assert CupyTuning().options("quant") == () and CupyTuning().options("ops") == ()
    t = CupyTuning(octet_units=4, pf_warps=2, use_mma=False)
    assert t.options("quant") == ("-DOCTET_UNITS=4",)
    assert t.options("ops") == ("-DPF_WARPS=2",)
    # every compiled knob's default is the one its kernel source states
    sources = {"quant": kernel_source(*QUANT_SOURCES), "ops": kernel_source(*OPS_SOURCES)}
    for name, (module, define, default) in DEFINES.items():
        stated = re.search(rf"#define {define} (\d+)", sources[module])
        assert stated is not None and int(stated[1]) == default == getattr(CupyTuning(), name), define


def test_bad_values_are_refused_and_the_object_is_frozen():
    with pytest.raises(ValueError, match="gemvn_groups"):
        CupyTuning(gemvn_groups=3)
    with pytest.raises(ValueError, match="gemvn_groups_wide"):
        CupyTuning(gemvn_groups_wide=8)
    with pytest.raises(ValueError, match="mma_threads"):
        CupyTuning(mma_threads=-1)
    with pytest.raises(ValueError, match="dec_ranks must be at most 32"):  # a lane each in the merge
        CupyTuning(dec_ranks=33)
    with pytest.raises(ValueError, match="prefill_gemm must be 0"):
        CupyTuning(prefill_gemm=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CupyTuning().use_mma = False  # type: ignore[misc]


def test_a_knob_set_on_the_backend_is_an_error_not_ignored():
    backend = CupyBackend.__new__(CupyBackend)  # no GPU: only the attribute guard is exercised
    with pytest.raises(AttributeError, match=r"retune\(use_mma=...\)"):
        backend.use_mma = False  # type: ignore[attr-defined]
    backend.stops_between_layers = False  # any other attribute is the backend's own
    assert backend.stops_between_layers is False


def test_the_n_token_products_groups_a_block_by_matrix_and_tokens():
    """gemvn's groups of four tokens a block (no GPU: the rule alone), for the 4B's matrices on an H200 (132 SMs,
    two blocks an SM): two for most, four for the Q4_K matrices of several column stages (o, down) at any count
    (two where twice their tiles fit the slots), and for gate_up (1 216 tiles, over four a block slot) up to 16
    tokens; never more than the groups there are; every choice follows the tuning."""
    from gguf import GGMLQuantizationType as Q

    from genie_workers.engine.backends.cupy.rows import groups_a_block

    t, slots = CupyTuning(), 264
    gate_up, qk, o, down, out = (1216, 2560), (320, 2560), (160, 4096), (160, 9728), (9496, 2560)
    assert groups_a_block(t, Q.Q4_K, *gate_up, 16, slots) == 4
    assert groups_a_block(t, Q.Q4_K, *gate_up, 40, slots) == 2
    assert groups_a_block(t, Q.Q4_K, *qk, 16, slots) == 2
    assert groups_a_block(t, Q.Q4_K, *o, 16, slots) == groups_a_block(t, Q.Q4_K, *down, 40, slots) == 4
    assert groups_a_block(t, Q.Q6_K, *down, 16, slots) == groups_a_block(t, Q.Q6_K, *out, 16, slots) == 2
    assert groups_a_block(t, Q.Q4_K, *gate_up, 5, slots) == 2 and groups_a_block(t, Q.Q4_K, *o, 3, slots) == 1
    wide_off = CupyTuning(gemvn_groups_wide=2)
    assert groups_a_block(wide_off, Q.Q4_K, *gate_up, 16, slots) == 2
    assert groups_a_block(t, Q.Q4_K, *gate_up, 16, 4 * slots) == 2  # a GPU with four times the slots
    # E2B's down (96 tiles of 12 288 values): 2 sets of 2 groups where twice its tiles fit the slots (an H100's),
    # else (an Orin's 16 slots) one of 4 as the 4B's
    e2b_down = (96, 12288)
    assert groups_a_block(t, Q.Q4_K, *e2b_down, 16, slots) == 2 and groups_a_block(t, Q.Q4_K, *e2b_down, 16, 16) == 4


def test_a_prompt_chunks_sets_of_groups_weigh_the_weights_passes_against_empty_groups_and_idle_slots():
    """gemvn's groups a block for a prompt chunk (more than four groups; no GPU: the rule alone), for the 4B's
    matrices with 8.x's instantiations (9.0's too, the counts past 4 in their cp.async form): 40 tokens of gate_up
    (1 216 tiles) in 2 sets of 5 on an H100 (264 block slots) and on an 8-SM Orin (16), 64 tokens in 2 sets of 8;
    v (64 tiles) in sets of 3, four sets that still fill the H100's slots in one wave (sets of 5: the same wave, a
    longer tile); of 1, 2 and 4 alone: 4."""
    from genie_workers.engine.backends.cupy.rows import prompt_groups

    q4, q6 = AMPERE.n_groups
    assert HOPPER.n_groups == AMPERE.n_groups
    assert prompt_groups(q4, 10, 1216, 264) == prompt_groups(q4, 10, 1216, 16) == 5
    assert prompt_groups(q4, 16, 1216, 264) == 8
    assert prompt_groups(q6, 10, 64, 264) == 3
    assert prompt_groups((1, 2, 4), 10, 1216, 264) == 4


def test_9_0_takes_the_cp_async_form_where_the_bulk_one_spills():
    """The n-token product's name a count of groups: 9.0's bulk gemvn at 1, 2 and 4 groups, its cp.async gemvnc at 3,
    5 and 8 (quant.cu instantiates those under PATHS_90); 8.x's gemvnc at every count."""
    assert [HOPPER.gemvn(g) for g in (1, 2, 3, 4, 5, 8)] == [
        "gemvn1",
        "gemvn2",
        "gemvnc3",
        "gemvn4",
        "gemvnc5",
        "gemvnc8",
    ]
    assert [AMPERE.gemvn(g) for g in (1, 3, 8)] == ["gemvnc1", "gemvnc3", "gemvnc8"]


@pytest.mark.parametrize(
    ("family", "stages", "ilp"), [(HOPPER, 3, 0), (AMPERE, 2, 1)], ids=lambda f: getattr(f, "name", f)
)
def test_the_products_ring_and_items_are_the_kernel_familys_unless_a_bench_asks_another(family, stages, ilp):
    """quant.cu states no ring of its own (MMA_STAGES) and no form of gemv1m's items (MMA_ILP): the backend builds
    them with its family's, 3 stages of bulk copies and chained mmas on 9.0, 2 of cp.async and mmas of their own
    on 8.x, or a benchmark's; a changed ring is a changed build (retune)."""
    dev = CupyDevice.__new__(CupyDevice)  # no GPU: only the build options are exercised
    dev.family = family
    built = dev.options("quant", CupyTuning())
    assert f"-DMMA_STAGES={stages}" in built and f"-DPATHS_90={int(family.paths_90)}" in built
    assert f"-DMMA_ILP={ilp}" in built
    assert "-DMMA_STAGES=4" in dev.options("quant", CupyTuning(mma_stages=4))
    assert f"-DMMA_ILP={1 - ilp}" in dev.options("quant", CupyTuning(mma_ilp=1 - ilp))
    assert not any("MMA_STAGES" in o or "MMA_ILP" in o for o in dev.options("ops", CupyTuning()))
    source = kernel_source(*QUANT_SOURCES)
    assert "#define MMA_STAGES" not in source and "#define MMA_ILP" not in source
    with pytest.raises(ValueError, match="mma_ilp"):
        CupyTuning(mma_ilp=2)


# (shared memory an SM, the most a block may opt in to) as the GPUs report them (cudaDeviceProp)
RTX_30, ORIN = (102_400, 101_376), (167_936, 166_912)


def products_on(smem: tuple[int, int], **tuning) -> CupyProducts:
    dev = CupyDevice.__new__(CupyDevice)  # no GPU: only the launch shapes are exercised
    dev.xp, dev.tuning = None, CupyTuning(**tuning)
    dev.family, dev.n_sm = AMPERE, 8
    dev.smem_per_sm, dev.smem_per_block = smem
    return CupyProducts(dev, weights=None, backend=None)  # type: ignore[arg-type]


def test_the_tensor_core_products_take_only_the_shared_memory_the_gpu_has():
    """The 8.x ring (2 stages) fits a Q6_K down matrix with its input in an RTX 30's block, where 3 stages
    (107 KiB) do not: that matrix takes the dp4a kernel then instead of failing to launch; an Orin fits both."""
    from gguf import GGMLQuantizationType as Q

    from genie_workers.engine.backends.cupy import QuantWeight
    from genie_workers.engine.backends.cupy.rows import groups_that_fit

    down = QuantWeight(None, Q.Q6_K, 2560, 9728)
    assert products_on(RTX_30)._mma_fits(down)
    assert not products_on(RTX_30, mma_stages=3)._mma_fits(down)
    assert products_on(ORIN, mma_stages=3)._mma_fits(down) and products_on(ORIN)._mma_fits(down)
    # gemvn at 16 warps: four groups of tokens a block need 32 KiB of sums beside the ring; an RTX 30 fits two
    assert groups_that_fit(products_on(RTX_30), down, 512, 4) == 2
    assert groups_that_fit(products_on(ORIN), down, 512, 4) == 4
    assert groups_that_fit(products_on(RTX_30), down, 256, 4) == 4


def test_a_gpu_runs_the_kernel_family_of_its_compute_capability():
    """One value a capability, chosen once: an H100/H200 the 9.0 paths, a Jetson Orin, an RTX 30/40 or an A100
    the 8.x ones (the same products and attention without bulk copies, clusters or PDL), a T4 or a V100 dp4a."""
    assert family_of((9, 0)) is HOPPER and family_of((10, 0)) is HOPPER
    assert all(family_of(c) is AMPERE for c in ((8, 0), (8, 6), (8, 7), (8, 9)))
    assert family_of((7, 5)) is OLDER and OLDER.products is None and OLDER.decode_attention is None
    assert not AMPERE.paths_90 and AMPERE.products == ("gemv1mc", "gemvnc")
