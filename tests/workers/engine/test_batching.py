"""Continuous batching: sequences that share steps get, logit for logit, what each gets alone, for every
architecture, both KV types, prompts of several chunks, streams that join and leave mid-way, a cancelled
and a failing stream among them, and a prefix copied from another slot; on every backend present, bit for
bit (CuPy: a decode row among others takes gemvn, which gives a token gemv1m's numbers; cupy/rows.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from genie_common.engine_options import EngineOptions
from genie_workers.engine.backends.cupy import cupy_available
from genie_workers.engine.backends.numpy_backend import NumpyBackend
from genie_workers.engine.engine import Engine
from genie_workers.engine.sampling import SamplingParams
from genie_workers.engine.sequence import Completion, Delta, Failed, Sequence
from testkit.tiny_models import ARCH_PARAMS, write_tiny_gemma4, write_tiny_model

ROOT = Path(__file__).parents[3]
ARCHS = [*ARCH_PARAMS, "gemma4", "llama-q4_k_m"]
CHUNK = 8  # prompt tokens a step: prompts below run in several chunks
N_SLOTS = 4
BACKENDS = ["numpy", pytest.param("cupy", marks=pytest.mark.skipif(not cupy_available(), reason="needs a GPU"))]
# ... and CuPy with every decode row's attention in attention_decb (a block a row and KV head), which a step takes
# from CupyTuning.decb_min_blocks rows x KV heads on (the tiny models' steps stay below it)
DECB = pytest.param("cupy-decb", marks=pytest.mark.skipif(not cupy_available(), reason="needs a GPU"))


def model_path(tmp_path: Path, arch: str) -> Path:
    if arch == "llama-q4_k_m":  # int8 blocks: decode rows of several streams share one C kernel call
        return ROOT / "testkit/fixtures/tiny/llama-q4_k_m.gguf"
    path = tmp_path / f"{arch}.gguf"
    if arch == "gemma4":  # PLE width 32: the GPU kernels read rows in 32-value sub-blocks
        write_tiny_gemma4(path, seed=3, ple_dim=32)
    else:
        write_tiny_model(arch, path, seed=3)
    return path


def make(path: Path, kv_dtype: str, n_slots: int = N_SLOTS, backend: str = "numpy", ahead: bool = False) -> Engine:
    options = EngineOptions(
        model=str(path),
        backend="cupy" if backend == "cupy-decb" else backend,
        ctx=160,
        prefill_chunk=CHUNK,
        parallel=n_slots,
    )
    engine = Engine(options, kv_dtype=kv_dtype, launch_ahead=ahead)  # type: ignore[arg-type]
    if backend == "cupy-decb":
        engine.backend.retune(decb_min_blocks=0)  # type: ignore[attr-defined]
    return engine


def prompt(seed: int, n: int) -> list[int]:
    """Random tokens, the first differing from seed to seed: no two prompts share a prefix, so no slot
    copies rows another computed (a copied row is computed in another chunk, and may differ in its last
    bit from the row computed alone)."""
    return [3 + seed, *np.random.default_rng(seed).integers(3, 380, n - 1).tolist()]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def record_logits(engine: Engine) -> dict[Sequence, list[np.ndarray]]:
    """Every row of logits each sequence samples from, as the engine hands them to the sampler (sample_rows)
    or, launching ahead, to the argmax whose tokens the next pass takes as they are (greedy_ahead)."""
    seen: dict[Sequence, list[np.ndarray]] = {}
    sample_rows, greedy_ahead = engine.sample_rows, engine.greedy_ahead

    def recording(logits, rows):
        host = engine.backend.to_host(logits)
        for seq, row in rows:
            seen.setdefault(seq, []).append(np.array(host[row], copy=True))
        return sample_rows(logits, rows)

    def recording_ahead(logits, rows):
        host = engine.backend.to_host(logits)
        for seq, row in rows:
            seen.setdefault(seq, []).append(np.array(host[row], copy=True))
        return greedy_ahead(logits, rows)

    engine.sample_rows = recording  # type: ignore[method-assign]
    engine.greedy_ahead = recording_ahead  # type: ignore[method-assign]
    return seen


def alone(engine: Engine, ids: list[int], params: SamplingParams) -> tuple[Completion, list[np.ndarray]]:
    """A sequence on its own, in a pool holding nothing."""
    engine.kv.clear()
    seen = record_logits(engine)
    *_, done = engine.generate(ids, params)
    del engine.sample_rows, engine.greedy_ahead
    assert isinstance(done, Completion)
    (rows,) = seen.values()
    return done, rows


def run_batched(
    engine: Engine, plan: list[tuple[int, Sequence]], until: Callable[[], bool] | None = None
) -> tuple[dict[Sequence, list], dict[Sequence, list[np.ndarray]]]:
    """Steps the scheduler, submitting each (step, sequence) of `plan` before that step; the events of
    each sequence, and the logits it sampled from."""
    engine.kv.clear()
    seen = record_logits(engine)
    events: dict[Sequence, list] = {seq: [] for _, seq in plan}
    step = 0
    while step < 500:
        for at, seq in plan:
            if at == step:
                engine.scheduler.submit(seq)
        if step > max(at for at, _ in plan) and engine.scheduler.idle:
            break
        for seq, ev in engine.step():
            events[seq].append(ev)
        step += 1
    del engine.sample_rows, engine.greedy_ahead
    assert engine.scheduler.idle
    return events, seen


def completion(events: list) -> Completion:
    done = events[-1]
    assert isinstance(done, Completion), done
    assert all(isinstance(ev, Delta) for ev in events[:-1])
    return done


@pytest.mark.parametrize("backend", [*BACKENDS, DECB])
@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_each_stream_gets_the_logits_it_gets_alone(tmp_path: Path, arch: str, kv_dtype: str, backend: str) -> None:
    """Five streams on four slots: prompts of 1 to 5 chunks, joining at steps 0, 0, 2 and 9, one waiting
    for a free slot; every logit of every step equals, bit for bit, the one it samples alone."""
    engine = make(model_path(tmp_path, arch), kv_dtype, backend=backend)
    specs = [(0, prompt(1, 5), 14), (0, prompt(2, 37), 10), (2, prompt(3, 13), 16), (9, prompt(4, 20), 6)]
    specs.append((9, prompt(5, 9), 8))  # the fifth: waits until a stream leaves
    plan = [(at, engine.sequence(ids, greedy(n))) for at, ids, n in specs]
    events, seen = run_batched(engine, plan)
    for (_, ids, n), (_, seq) in zip(specs, plan, strict=True):
        done = completion(events[seq])
        solo, solo_rows = alone(engine, ids, greedy(n))
        assert done.token_ids == solo.token_ids and len(done.token_ids) == n
        assert done.text == solo.text
        assert len(seen[seq]) == len(solo_rows)
        for got, want in zip(seen[seq], solo_rows, strict=True):
            np.testing.assert_array_equal(got, want)


class RowwiseNumpy(NumpyBackend):
    """NumPy whose float products take a row at a time, so a row's numbers do not depend on the rows that share
    its call, as the GPU kernels' and the block products' do not: BLAS sums a GEMM of 16 rows in another order
    than one of 5, and an INT8 pool codes those last bits into a code apart (1e-3 of a logit's range on one
    machine's OpenBLAS, none on another's)."""

    def _product(self, x: Any, weight: Any, then: Any = None) -> Any:
        if isinstance(weight, np.ndarray) and x.ndim == 2 and x.shape[0] > 1:
            return np.concatenate([x[i : i + 1] @ weight.T for i in range(x.shape[0])])
        return super()._product(x, weight, then)


class PaddingNumpy(RowwiseNumpy):
    """RowwiseNumpy with a GPU's step buckets whose steps mixing prompt chunks with decode rows go by their shape: the
    engine then pads each chunk of such a step to its bucket, as it does where it captures them; the keys
    and whether the step was capturable are recorded."""

    step_buckets = (16, 32, 48, 64)

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[tuple[object, bool]] = []

    def mixed_steps_by_shape(self, cfg: object, kv: object) -> bool:
        return True

    def forward_step(self, steps, key, run, batch, capturable):  # type: ignore[no-untyped-def]
        self.keys.append((key, capturable))
        return run()


MIXED_SPECS = [(0, 5, 14), (2, 37, 10), (4, 13, 12), (5, 20, 6)]  # (joins at step, prompt tokens, tokens)


def on_backend(path: Path, backend: NumpyBackend) -> Engine:
    """An engine of 32-token chunks on this backend object (PaddingNumpy and its kin)."""
    from genie_workers.engine.model import Model

    options = EngineOptions(model=str(path), backend="numpy", ctx=160, prefill_chunk=32, parallel=N_SLOTS)
    return Engine(options, Model.load(str(path), backend))


def each_as_alone(engine: Engine, specs: list, plan: list, events: dict, seen: dict) -> None:
    """Every stream of a run_batched plan got the tokens, and every logit bit for bit, it gets alone."""
    for (_, ids, n), (_, seq) in zip(specs, plan, strict=True):
        done = completion(events[seq])
        solo, solo_rows = alone(engine, ids, greedy(n))
        assert done.token_ids == solo.token_ids
        for got, want in zip(seen[seq], solo_rows, strict=True):
            np.testing.assert_array_equal(got, want)


def run_mixed(engine: Engine) -> tuple[list, list, dict, dict]:
    """MIXED_SPECS through the engine: the specs, the plan, and run_batched's events and logits."""
    specs = [(at, prompt(i + 1, n), gen) for i, (at, n, gen) in enumerate(MIXED_SPECS)]
    plan = [(at, engine.sequence(ids, greedy(n))) for at, ids, n in specs]
    events, seen = run_batched(engine, plan)
    return specs, plan, events, seen


@pytest.mark.parametrize("arch", ["llama", "llama-q4_k_m"])
def test_steps_mixing_prompt_chunks_with_decode_rows_are_padded_to_their_buckets(tmp_path: Path, arch: str) -> None:
    """Where a backend's mixed steps go by their shape, a step mixing prompt chunks with decode rows runs each
    chunk padded to its step bucket and is keyed by its shape (the sizes in order); the pad's K/V reaches no
    real row: every logit of every stream equals, bit for bit, the one it gets alone without buckets (nothing
    padded; float products a row at a time on both, RowwiseNumpy), and its slot holds its own tokens, not the
    pad."""
    backend, path = PaddingNumpy(), model_path(tmp_path, arch)
    engine = on_backend(path, backend)
    specs, plan, events, seen = run_mixed(engine)
    mixed = [key for key, capturable in backend.keys if key[0] == "mixed" and capturable]
    assert mixed, backend.keys
    assert any(n not in (1, 16) for key in mixed for n, _ in key[1])  # a chunk padded past the first bucket
    for key in mixed:
        assert all(n == 1 or n in PaddingNumpy.step_buckets for n, _ in key[1]), key
    plain = on_backend(path, RowwiseNumpy())  # the same engine without the buckets: nothing padded
    for (_, ids, n), (_, seq) in zip(specs, plan, strict=True):
        done = completion(events[seq])
        solo, solo_rows = alone(plain, ids, greedy(n))
        assert done.token_ids == solo.token_ids
        for got, want in zip(seen[seq], solo_rows, strict=True):
            np.testing.assert_array_equal(got, want)
        assert list(engine.kv.held(seq.slot)) == [*ids, *done.token_ids[:-1]]


class EagerPaddingNumpy(PaddingNumpy):
    """The same buckets, but mixed steps that do not go by their shape (a GPU whose attention takes the slots as
    arguments): they run eagerly."""

    def mixed_steps_by_shape(self, cfg: object, kv: object) -> bool:
        return False


def test_eager_mixed_steps_pad_each_chunk_as_it_is_padded_alone(tmp_path: Path) -> None:
    """A step mixing prompt chunks with decode rows that is not captured still pads each chunk to the bucket a
    lone chunk is padded to (products of 16 rows are not those of 5 in the last bits, on NumPy as with cuBLAS):
    every logit of every stream equals, bit for bit, the one it gets alone."""
    backend = EagerPaddingNumpy()
    engine = on_backend(model_path(tmp_path, "llama"), backend)
    specs, plan, events, seen = run_mixed(engine)
    assert (("mixed",), False) in backend.keys  # eager mixed steps ran
    each_as_alone(engine, specs, plan, events, seen)


@pytest.mark.skipif(not cupy_available(), reason="needs a GPU")
@pytest.mark.parametrize("arch", ["llama-q4_k_m", "qwen3", "gemma3"])
def test_captured_steps_mixing_prompt_chunks_with_decode_rows_give_each_stream_its_numbers(
    tmp_path: Path, arch: str
) -> None:
    """Steps mixing padded prompt chunks with decode rows captured by their shape and replayed
    for other slots and positions; every logit of every stream equals, bit for bit, the one it gets alone."""
    path = model_path(tmp_path, arch)
    engine = Engine(EngineOptions(model=str(path), backend="cupy", ctx=160, prefill_chunk=32, parallel=4))
    gpu = engine.backend
    if not gpu.decode_steps_by_count(engine.model.config, engine.kv):
        pytest.skip("this GPU's one-token attention takes the slot as an argument (compute capability < 8.0)")
    specs = [(at, prompt(i + 1, n), gen) for i, (at, n, gen) in enumerate(MIXED_SPECS)]
    specs += [(7, prompt(9, 13), 6)]  # the same shape again, other slots and positions: a replay
    plan = [(at, engine.sequence(ids, greedy(n))) for at, ids, n in specs]
    events, seen = run_batched(engine, plan)
    assert any(k[0] == "mixed" and v not in (None, False) for k, v in engine._steps.items()), engine._steps
    each_as_alone(engine, specs, plan, events, seen)


def test_a_cancelled_and_a_failing_stream_leave_the_others_untouched(tmp_path: Path) -> None:
    engine = make(model_path(tmp_path, "llama-q4_k_m"), "int8")
    cancelled = {"now": False}
    keep = [prompt(11, 12), prompt(12, 30)]
    seqs = [engine.sequence(ids, greedy(12)) for ids in keep]
    doomed = engine.sequence(prompt(13, 20), greedy(12), cancel=lambda: cancelled["now"])
    broken = engine.sequence(prompt(14, 6), SamplingParams(temperature=0.7, max_tokens=12, seed=1))

    def bad_sample(row: np.ndarray) -> int:  # as a constraint that breaks on its third token
        if len(broken.generated) == 2:
            raise RuntimeError("the grammar broke")
        return Sequence.sample_host(broken, row)

    broken.sample_host = bad_sample  # type: ignore[method-assign]
    plan = [(0, seqs[0]), (0, doomed), (0, broken), (1, seqs[1])]
    original = engine.step

    def step():  # the cancel arrives in the middle of the doomed stream's answer
        if len(doomed.generated) == 4:
            cancelled["now"] = True
        return original()

    engine.step = step  # type: ignore[method-assign]
    events, _ = run_batched(engine, plan)
    del engine.step
    assert completion(events[doomed]).finish_reason == "cancelled"
    assert len(completion(events[doomed]).token_ids) == 4
    assert isinstance(events[broken][-1], Failed) and "grammar broke" in str(events[broken][-1].error)
    for ids, seq in zip(keep, seqs, strict=True):
        assert completion(events[seq]).token_ids == alone(engine, ids, greedy(12))[0].token_ids


def test_a_voice_prompt_is_prefilled_first(tmp_path: Path) -> None:
    """A long background prompt and a short voice one arrive together: the voice stream's first token
    comes from the first step, which runs its prompt alone, before the background prompt's first chunk."""
    engine = make(model_path(tmp_path, "llama"), "f16")
    background = engine.sequence(prompt(21, 40), greedy(4), priority="background")
    voice = engine.sequence(prompt(22, CHUNK), greedy(4))  # a sequence that names none is a voice one
    steps: list[list[int]] = []  # the slots of each step's segments
    run_step = engine.run_step

    def recording(segments, interrupt):  # type: ignore[no-untyped-def]
        steps.append([s.slot for s in segments])
        return run_step(segments, interrupt)

    engine.run_step = recording  # type: ignore[method-assign]
    engine.scheduler.submit(background)
    engine.scheduler.submit(voice)
    while not engine.scheduler.idle:
        engine.step()
    assert steps[0] == [voice.slot] and len(voice.generated) == 4 and len(background.generated) == 4


def test_a_prefix_another_slot_holds_is_copied_not_recomputed(tmp_path: Path) -> None:
    """A second conversation with the same system prompt, arriving while the first decodes: its slot gets
    the shared rows by copy (cached_tokens), and it answers as it does from a cold start."""
    engine = make(model_path(tmp_path, "qwen3"), "int8")
    system = prompt(31, 33)
    first = engine.sequence(system + [50, 51, 52], greedy(10))
    second_ids = system + [60, 61]
    second = engine.sequence(second_ids, greedy(10))
    events, _ = run_batched(engine, [(0, first), (6, second)])
    done = completion(events[second])
    assert done.cached_tokens == len(system)
    assert second.slot != first.slot
    assert done.token_ids == alone(engine, second_ids, greedy(10))[0].token_ids


def test_a_prewarm_among_streams_fills_its_slot_and_says_nothing(tmp_path: Path) -> None:
    engine = make(model_path(tmp_path, "gemma3"), "int8")
    talk = engine.sequence(prompt(41, 10), greedy(8))
    warm_ids = prompt(42, 19)
    warm = engine.sequence(warm_ids, SamplingParams(max_tokens=0))
    events, _ = run_batched(engine, [(0, talk), (0, warm)])
    assert events[warm] == [completion(events[warm])]
    assert completion(events[warm]).finish_reason == "length"
    assert list(engine.kv.held(warm.slot)) == warm_ids
    assert completion(events[talk]).token_ids == alone(engine, prompt(41, 10), greedy(8))[0].token_ids


def test_a_stream_whose_own_handling_raises_fails_alone(tmp_path: Path) -> None:
    """A grammar that raises as it takes a token (inside accept), and a prompt chunk whose step fails (a
    chunk too large for the memory left): those requests fail, the streams decoding beside them go on and
    answer as alone."""
    engine = make(model_path(tmp_path, "llama-q4_k_m"), "int8")
    keep_ids = [prompt(51, 9), prompt(52, 14)]
    keep = [engine.sequence(ids, greedy(10)) for ids in keep_ids]
    grammar = engine.sequence(prompt(53, 7), greedy(10))
    chunk = engine.sequence(prompt(54, 20), greedy(10))
    accept = grammar.accept

    def breaking(token: int, n_ctx: int, pos: int | None = None):  # type: ignore[no-untyped-def]
        if len(grammar.generated) == 3:
            raise RuntimeError("the grammar broke")
        return accept(token, n_ctx, pos)

    grammar.accept = breaking  # type: ignore[method-assign]
    run_step = engine.run_step

    def failing(segments, interrupt):  # type: ignore[no-untyped-def]
        if any(s.slot == chunk.slot and s.n > 1 for s in segments):
            raise MemoryError("out of memory for the chunk")
        return run_step(segments, interrupt)

    engine.run_step = failing  # type: ignore[method-assign]
    events, _ = run_batched(engine, [(0, keep[0]), (0, grammar), (3, keep[1]), (5, chunk)])
    del engine.run_step
    assert isinstance(events[grammar][-1], Failed) and len(grammar.generated) == 3
    assert isinstance(events[chunk][-1], Failed) and isinstance(events[chunk][-1].error, MemoryError)
    for ids, seq in zip(keep_ids, keep, strict=True):
        assert completion(events[seq]).token_ids == alone(engine, ids, greedy(10))[0].token_ids


def test_a_slot_freed_by_a_cancel_is_not_given_again_in_the_same_step(tmp_path: Path) -> None:
    """The worker saves an ended sequence's KV from its slot after the step: a request waiting for that
    slot gets it one step later, so the save reads the ended sequence's rows, not the next one's."""
    engine = make(model_path(tmp_path, "llama"), "f16", n_slots=1)
    stop = {"now": False}
    first = engine.sequence(prompt(61, 6), greedy(30), cancel=lambda: stop["now"])
    second = engine.sequence(prompt(62, 6), greedy(3))
    sched = engine.scheduler
    sched.submit(first)
    engine.step()
    engine.step()
    held = list(engine.kv.held(0))
    sched.submit(second)
    stop["now"] = True
    ended = engine.step()
    assert [type(ev).__name__ for s, ev in ended if s is first][-1] == "Completion"
    assert second in sched.waiting and list(engine.kv.held(0)) == held  # the slot still holds what it held
    while not sched.idle:
        engine.step()
    assert second.done


@pytest.mark.skipif(not cupy_available(), reason="needs a GPU")
def test_a_decode_step_captured_for_some_slots_replays_for_others(tmp_path: Path) -> None:
    """Where the backend reads a step's slots from a staged buffer (decode_steps_by_count), the decode step of
    two streams is captured once, for slots 0 and 1, and replayed for slots 2 and 3 holding the same
    conversations: the same logits, bit for bit (streams that join and leave used to cost a capture for
    every new set of slots)."""
    from genie_workers.engine.batch import Segment

    engine = make(model_path(tmp_path, "llama-q4_k_m"), "int8", backend="cupy")
    if not engine.backend.decode_steps_by_count(engine.model.config, engine.kv):
        pytest.skip("this GPU's one-token attention takes the slot as an argument (compute capability < 8.0)")
    a, b = prompt(1, 9), prompt(2, 9)
    for slot, ids in ((0, a), (1, b), (2, a), (3, b)):
        engine._run(slot, ids, 0, None)

    def step(slots: tuple[int, int], pos: int, tokens: tuple[int, int]) -> np.ndarray:
        segments = [Segment(s, pos, (t,), True) for s, t in zip(slots, tokens, strict=True)]
        return np.array(engine.backend.to_host(engine.run_step(segments, None)), copy=True)

    first = step((0, 1), 9, (5, 6))  # eager, then captured
    second = step((0, 1), 10, (7, 8))  # replayed
    moved = step((2, 3), 9, (5, 6))  # replayed for the other slots
    again = step((2, 3), 10, (7, 8))
    assert [k for k in engine._steps if k[0] == "decode"] == [("decode", 2)]
    np.testing.assert_array_equal(moved, first)
    np.testing.assert_array_equal(again, second)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_steps_of_every_count_are_captured_before_any_request(tmp_path: Path, backend: str) -> None:
    """capture_decode_steps (the worker's, before READY): on a backend that captures steps, the decode step of
    each count of streams up to the slots, the slots left empty; streams that then join one by one replay
    those steps, never capturing them again, and each gets what it gets alone. A backend that captures
    nothing runs nothing."""
    path = model_path(tmp_path, "llama-q4_k_m")
    engine = make(path, "int8", backend=backend, ahead=True)
    if backend == "numpy":
        assert engine.capture_decode_steps() == 0 and not engine._steps
        return
    if not engine.backend.decode_steps_by_count(engine.model.config, engine.kv):
        pytest.skip("this GPU's one-token attention takes the slot as an argument (compute capability < 8.0)")
    assert engine.capture_decode_steps() == N_SLOTS
    assert all(not engine.kv.n_held(s) for s in range(engine.kv.config.n_slots))
    decode_keys = [("step", 1, (-1, None, None)), *(("decode", k) for k in range(2, N_SLOTS + 1))]
    assert sorted(engine._steps, key=str) == sorted(decode_keys, key=str)
    captured = {key: engine._steps[key] for key in decode_keys}
    specs = [(3 * i, prompt(40 + i, 6 + i), 12) for i in range(N_SLOTS)]
    plan = [(at, engine.sequence(ids, greedy(n))) for at, ids, n in specs]
    events, _ = run_batched(engine, plan)
    assert all(engine._steps.get(key) is step for key, step in captured.items())
    plain = make(path, "int8", backend=backend)
    for (_, ids, n), (_, seq) in zip(specs, plan, strict=True):
        assert completion(events[seq]).token_ids == alone(plain, ids, greedy(n))[0].token_ids


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
def test_a_slot_exported_and_loaded_into_another_continues_alike(tmp_path: Path, kv_dtype: str, backend: str) -> None:
    """A slot's K/V exported (KVCache.export: each array group in one transfer) and loaded into another slot:
    every layer's arrays come back equal, and the next token's logits in both slots are the same, bit for bit."""
    engine = make(model_path(tmp_path, "qwen3"), kv_dtype, n_slots=2, backend=backend)
    ids = prompt(21, 35)
    engine._run(0, ids, 0, slice(-1, None))
    snap = engine.export_kv(0)
    assert snap.n_tokens == len(ids) and len(snap.k) == engine.kv.config.n_layers
    engine.import_kv(snap, 1)
    again = engine.export_kv(1)
    for name in ("k", "v", "k_scale", "v_scale"):
        for a, b in zip(getattr(snap, name) or [], getattr(again, name) or [], strict=True):
            np.testing.assert_array_equal(a, b)
    nexts = [engine.backend.to_host(engine._run(slot, [7], len(ids), slice(-1, None))) for slot in (0, 1)]
    np.testing.assert_array_equal(nexts[0], nexts[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_export_started_before_its_slot_is_overwritten_holds_the_rows_it_had(tmp_path: Path, backend: str) -> None:
    """A save starts the slot's copy to the host and goes on (Engine.start_export_kv: queued on the device
    behind the step that wrote the rows); a step that then overwrites the slot, before anything waited for
    the copy, does not change what it exports."""
    engine = make(model_path(tmp_path, "qwen3"), "int8", n_slots=2, backend=backend)
    ids = prompt(21, 35)
    engine._run(0, ids, 0, slice(-1, None))
    want = engine.export_kv(0)
    pending = engine.start_export_kv(0)
    engine.kv.clear(0)
    engine._run(0, prompt(5, 35), 0, slice(-1, None))  # the slot's next sequence, at the same positions
    got = pending.snapshot()
    assert list(got.token_ids) == ids
    for name in ("k", "v", "k_scale", "v_scale"):
        for a, b in zip(getattr(want, name), getattr(got, name), strict=True):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(engine.export_kv(0).k[0], want.k[0])  # the slot did change


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
@pytest.mark.parametrize("arch", ["llama-q4_k_m", "qwen3", "gemma3"])
def test_steps_launched_ahead_give_each_stream_what_it_gets_alone(
    tmp_path: Path, arch: str, kv_dtype: str, backend: str
) -> None:
    """launch_ahead (each pass launched before the tokens of the one before are read into text): five streams
    joining and leaving as in the test above get every logit and every event they get alone, step by step."""
    engine = make(model_path(tmp_path, arch), kv_dtype, backend=backend, ahead=True)
    specs = [(0, prompt(1, 5), 14), (0, prompt(2, 37), 10), (2, prompt(3, 13), 16), (9, prompt(4, 20), 6)]
    specs.append((9, prompt(5, 9), 8))
    plan = [(at, engine.sequence(ids, greedy(n))) for at, ids, n in specs]
    events, seen = run_batched(engine, plan)
    plain = make(model_path(tmp_path, arch), kv_dtype, backend=backend)
    last = {seq.slot: seq for _, seq in plan}  # each slot's last stream (the plan is in order of arrival)
    for (_, ids, n), (_, seq) in zip(specs, plan, strict=True):
        solo, solo_rows = alone(plain, ids, greedy(n))
        done = completion(events[seq])
        assert (done.token_ids, done.text, done.finish_reason) == (solo.token_ids, solo.text, solo.finish_reason)
        assert [e.text for e in events[seq][:-1]] == [e.text for e in plain_events(plain, ids, greedy(n))[:-1]]
        assert len(seen[seq]) == len(solo_rows)
        for got, want in zip(seen[seq], solo_rows, strict=True):
            np.testing.assert_array_equal(got, want)
        if last[seq.slot] is seq:  # (the fifth stream took over a slot another had)
            assert list(engine.kv.held(seq.slot)) == [*ids, *done.token_ids[:-1]]  # the last token ended it: not run


@pytest.mark.skipif(not cupy_available(), reason="needs a GPU")
@pytest.mark.parametrize("n_streams", [1, 3])
def test_passes_launched_ahead_take_their_input_tokens_on_the_device(tmp_path: Path, n_streams: int) -> None:
    """Launched ahead on the GPU, a decode pass of the make-up of the pass in flight is replayed with that pass's
    tokens as they are on the device (Backend.replay_ahead), before the host reads them: all but the first few
    passes of streams that decode together are, and each stream still gets what it gets alone."""
    path = model_path(tmp_path, "llama-q4_k_m")
    engine = make(path, "int8", backend="cupy", ahead=True)
    replayed: list[bool] = []
    replay_ahead = engine.backend.replay_ahead

    def counting(*args):  # type: ignore[no-untyped-def]
        out = replay_ahead(*args)
        replayed.append(out is not None)
        return out

    engine.backend.replay_ahead = counting  # type: ignore[method-assign]
    specs = [(prompt(90 + i, 7 + 5 * i), 20) for i in range(n_streams)]
    plan = [(0, engine.sequence(ids, greedy(n))) for ids, n in specs]
    events, seen = run_batched(engine, plan)
    plain = make(path, "int8", backend="cupy")
    for (ids, n), (_, seq) in zip(specs, plan, strict=True):
        solo, solo_rows = alone(plain, ids, greedy(n))
        assert completion(events[seq]).token_ids == solo.token_ids
        for got, want in zip(seen[seq], solo_rows, strict=True):
            np.testing.assert_array_equal(got, want)
    assert sum(replayed) >= 12, replayed


def test_a_token_sampled_before_a_pass_of_another_make_up_is_returned_before_that_pass_runs(tmp_path: Path) -> None:
    """Launched ahead, a stream decoding alone, then a prompt joining: the step that samples the stream's token
    and finds the next pass of another make-up (its decode row and the prompt's chunk, which a device may
    capture first, tens of milliseconds) returns that token's event without running the pass; the next step
    runs it. Passes of the same make-up still run in the call that reads the tokens of the one before."""
    engine = make(model_path(tmp_path, "qwen3"), "int8", ahead=True)
    first = engine.sequence(prompt(81, 6), greedy(12))
    runs: list[tuple[int, ...]] = []
    run_step = engine.run_step

    def counting(segments, interrupt):  # type: ignore[no-untyped-def]
        runs.append(tuple(seg.n for seg in segments))
        return run_step(segments, interrupt)

    engine.run_step = counting  # type: ignore[method-assign]
    sched = engine.scheduler
    sched.submit(first)
    while len(first.generated) < 3:
        engine.step()
    before = len(runs)
    events = engine.step()  # a decode pass like the last: launched in the same call that reads a token
    assert len(runs) == before + 1 and runs[-1] == (1,) and any(seq is first for seq, _ in events)
    sched.submit(engine.sequence(prompt(82, 20), greedy(4)))
    before = len(runs)
    events = engine.step()  # the next pass would be (1, 8): the token goes back first, nothing launched
    assert len(runs) == before and [seq for seq, _ in events] == [first]
    events = engine.step()
    assert runs[before:] == [(1, CHUNK)]
    while not sched.idle:
        engine.step()


def plain_events(engine: Engine, ids: list[int], params: SamplingParams) -> list:
    engine.kv.clear()
    return list(engine.generate(ids, params))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_end_of_generation_read_after_the_next_pass_launched_ends_its_stream_there(
    tmp_path: Path, backend: str
) -> None:
    """Launched ahead, passes chain (the next one takes the tokens of the one in flight before they are read), so
    an end-of-generation token is found only once the pass after it is launched with it: that row is left unused.
    The stream ends at the same token with the same text as without launching ahead, its slot holds what that
    pass wrote (the end token's K/V, which is valid: one token more than without launching ahead), and the
    stream beside it answers as alone."""
    path = model_path(tmp_path, "qwen3")
    plain = make(path, "int8", backend=backend)
    ids, other = prompt(64, 10), prompt(65, 14)
    free = plain_events(plain, ids, greedy(20))[-1]
    end = free.token_ids[6]  # a token it says: made its end of generation below
    cut = free.token_ids.index(end)

    def ending(engine: Engine) -> Sequence:
        seq = engine.sequence(ids, SamplingParams(temperature=0, max_tokens=20))
        seq.eog = frozenset({end})
        return seq

    results = {}
    for ahead in (False, True):
        engine = make(path, "int8", backend=backend, ahead=ahead)
        seq, beside = ending(engine), engine.sequence(other, greedy(16))
        events, _ = run_batched(engine, [(0, seq), (0, beside)])
        done = completion(events[seq])
        assert (done.token_ids, done.finish_reason) == (free.token_ids[: cut + 1], "stop")
        assert completion(events[beside]).token_ids == plain_events(plain, other, greedy(16))[-1].token_ids
        results[ahead] = (done.text, [e.text for e in events[seq]], list(engine.kv.held(seq.slot)))
    assert results[True][:2] == results[False][:2]
    held_ahead, held_plain = results[True][2], results[False][2]
    assert held_plain == [*ids, *free.token_ids[:cut]]  # not launching ahead, the end token never ran
    assert held_ahead == [*held_plain, end]  # launched ahead, the pass after it ran with it


@pytest.mark.parametrize("ahead", [False, True])
def test_a_stop_string_and_a_full_context_end_a_stream_where_they_do_without_launching_ahead(
    tmp_path: Path, ahead: bool
) -> None:
    """A stop string (found only as the token is read into text: the pass launched ahead with it is left
    unused) and a context that fills end a stream at the same token, with the same text, launched ahead or
    not; the stream beside them answers as alone."""
    path = model_path(tmp_path, "qwen3")
    plain = make(path, "int8")
    free = plain_events(plain, prompt(61, 12), greedy(24))[-1]
    stop = free.text[len(free.text) // 2 :][:3]  # a piece of the middle of its answer
    assert stop.strip()
    engine = make(path, "int8", ahead=ahead)
    stopped = engine.sequence(prompt(61, 12), SamplingParams(temperature=0, max_tokens=24, stop=[stop]))
    full = engine.sequence(prompt(62, 150), greedy(40))  # n_ctx 160: room for 10 tokens
    beside = engine.sequence(prompt(63, 20), greedy(16))
    events, _ = run_batched(engine, [(0, stopped), (0, full), (1, beside)])
    want = plain_events(plain, prompt(61, 12), SamplingParams(temperature=0, max_tokens=24, stop=[stop]))[-1]
    got = completion(events[stopped])
    assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, "stop")
    assert stop not in got.text and len(got.token_ids) < len(free.token_ids)
    want_full = plain_events(plain, prompt(62, 150), greedy(40))[-1]
    assert completion(events[full]).token_ids == want_full.token_ids and want_full.finish_reason == "length"
    assert completion(events[beside]).token_ids == plain_events(plain, prompt(63, 20), greedy(16))[-1].token_ids


@pytest.mark.parametrize("ahead", [False, True])
def test_a_failing_decode_step_fails_its_streams_and_nothing_follows(tmp_path: Path, ahead: bool) -> None:
    """A step of decode rows alone that raises fails every stream in it: Failed is each one's last event,
    launched ahead or not (a token sampled before the failing pass was launched is not read into text after)."""
    engine = make(model_path(tmp_path, "qwen3"), "int8", ahead=ahead)
    seqs = [engine.sequence(prompt(71 + i, 6), greedy(12)) for i in range(2)]
    run_step = engine.run_step

    def failing(segments, interrupt):  # type: ignore[no-untyped-def]
        if all(s.n == 1 for s in segments) and min(len(q.generated) for q in seqs) >= 3:
            raise RuntimeError("the device lost a step")
        return run_step(segments, interrupt)

    engine.run_step = failing  # type: ignore[method-assign]
    events, _ = run_batched(engine, [(0, seq) for seq in seqs])
    for seq in seqs:
        assert isinstance(events[seq][-1], Failed) and "lost a step" in str(events[seq][-1].error)
        assert not any(isinstance(ev, Completion) for ev in events[seq])
        assert 3 <= len(seq.generated) <= 4
