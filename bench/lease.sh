#!/usr/bin/env bash
# The GPU checks the open GPU issues ask for, by name, for a lease's calls (the device tool; bench/h200.sh runs
# each as a stage with its own time limit and log):
#   bash bench/h200.sh "warm:200:bash bench/lease.sh warm" "t87:300:bash bench/lease.sh suite sm87" \
#                      "t90:240:bash bench/lease.sh suite 90"
#   warm               the tree's kernel modules of both families compiled at once (CuPy's disk cache), so the
#                      suite's workers do not each compile them (a cold cache cut a 400 s suite at ~50 %)
#   suite FAMILY       the GPU test files on the 8.x (sm87) or 9.0 (90) paths, 14 workers
#   llama              llama.cpp's figures (bench/llama_gpu.py, --repeats 2, the three models) into
#                      $OUT/llama.json, and llama-bench's decode on 8 SMs; needs a build of this call or an earlier
#                      one on the same machine (../shared/tools/llama-cpp-gpu.sh build; carry .llama only then)
#   issue35 JSON       issue 35's tables on the 8.x paths beside llama.cpp's JSON: bench/gpu.py, bench/batch.py,
#                      and decode on 8 SMs
#   issue36 JSON       issue 36's: E2B's gpu.py and batch.py on both families, and decode on 8 SMs (8.x)
#   profile36          E2B's step split by kernel family (bench/batch_profile.py) at 1, 2 and 16 streams, both
#                      families (issue 36's "after"; 2 streams: the count where E2B's 8.x lead is least)
#   acc4, acc5         the 9.0 paths' Qwen rows of gpu.py and batch.py, the tree against the commits bench/commits.sh
#                      prepared: issue 35's acceptance 4 against d566083 (the commit before the 8.x work), issue
#                      36's acceptance 5 against 947a02c (the last before the E2B work); the same calls
#   patched NAMES FAMILY PYTEST_ARGS...
#                      bench/wip/NAME.patch (NAMES: NAME[+NAME]) applied to the device's copy of the tree (once: a
#                      later stage of the call finds it applied), its kernels compiled (warm), then those tests
#                      on that family, 14 workers; later stages of the call run the patched tree too
#   prefill FAMILY     pp512 and decode @0 of E2B, the 4B and the 0.6B, the tree against the commits prepared; for
#                      the prefill patches: `bench/commits.sh patch prefill-bf16` here
#                      (prefill-bf16 runs at prefill_gemm 3), d566083 not prepared (or moved aside)
# Every command prints what it runs. FEW_SMS names few-sms.sh (../shared/tools/, copied into the tree to carry it).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/tree_path.sh
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$(tree_path .)}
few_sms=${FEW_SMS:-scratch/few-sms.sh}
GPU_TESTS=(
    tests/workers/engine/test_captured_steps.py tests/workers/engine/arch/test_tiny_models.py
    tests/workers/engine/test_step_buckets.py tests/workers/engine/test_batching.py tests/workers/test_worker.py
    tests/workers/engine/backends/test_conformance.py tests/workers/engine/backends/test_cupy_chain.py
    tests/workers/engine/backends/test_pdl.py tests/workers/engine/backends/test_cupy_tuning.py
    tests/workers/engine/backends/test_cupy_backend.py tests/workers/engine/backends/test_cupy_kernels.py
    tests/workers/engine/backends/test_cuda_compat.py
)
QWEN=(qwen3-4b qwen3-0.6b)
run() { echo "+ $*" && "$@"; }
compat() { [ "$1" = 90 ] && echo "" || echo "$1"; }

case "${1:-}" in
warm)
    for family in sm87 90; do
        GENIE_CUDA_COMPAT=$(compat $family) python3 -c "
from genie_workers.engine.backends.cupy.backend import CupyBackend
dev = CupyBackend().dev
dev.op('rms_norm'), dev.kernel_named('q8_input')  # a kernel of each module: both compiled
print('$family: modules compiled')" &
    done
    wait
    ;;
suite)
    family=${2:?usage: lease.sh suite sm87|90}
    GENIE_CUDA_COMPAT=$(compat "$family") run python3 -m pytest -q -n 14 -p no:benchmark \
        -p no:cacheprovider "${GPU_TESTS[@]}"
    ;;
llama)
    run python3 bench/llama_gpu.py --models "${QWEN[@]}" gemma4-e2b --repeats 2 --out /tmp/genie-bench &&
        cp /tmp/genie-bench/llama.json "${OUT:-/tmp}/llama.json"
    for m in qwen3-4b gemma4-e2b; do
        run bash "$few_sms" 6 .llama/build/bin/llama-bench -m "/tmp/genie-bench/$m-q4_k_m.gguf" -ngl 99 -fa 1 \
            -p 0 -n 64 -r 2
    done
    ;;
issue35)
    json=${2:?issue35 LLAMA_JSON}
    export GENIE_CUDA_COMPAT=sm87
    run python3 bench/gpu.py --models "${QWEN[@]}" --kv int8 --depths 0 1024 4096 --repeats 2 --llama "$json"
    run python3 bench/batch.py --models "${QWEN[@]}" --kv int8 --streams 1 2 4 8 16 --ttft 33 --llama "$json"
    run bash "$few_sms" 6 python3 bench/gpu.py --models qwen3-4b --kv int8 --depths 0 --repeats 1
    ;;
issue36)
    json=${2:?issue36 LLAMA_JSON}
    for family in 90 sm87; do
        export GENIE_CUDA_COMPAT=$(compat $family)
        run python3 bench/gpu.py --models gemma4-e2b --kv int8 --depths 0 1024 4096 --repeats 2 --llama "$json"
        run python3 bench/batch.py --models gemma4-e2b --kv int8 --streams 1 2 4 8 16 --ttft 33 --llama "$json"
    done
    run bash "$few_sms" 6 python3 bench/gpu.py --models gemma4-e2b --kv int8 --depths 0 --repeats 1
    ;;
profile36)
    for family in 90 sm87; do
        GENIE_CUDA_COMPAT=$(compat $family) run python3 bench/batch_profile.py --model gemma4-e2b --kv int8 \
            --streams 1 2 16
    done
    ;;
acc4 | acc5)
    run bash bench/commits.sh run python3 bench/gpu.py --models "${QWEN[@]}" --kv int8 --repeats 2
    run bash bench/commits.sh run python3 bench/batch.py --models "${QWEN[@]}" --kv int8 --streams 1 2 4 8 16 --ttft 33
    ;;
patched)
    names=${2:?usage: lease.sh patched NAME[+NAME] sm87|90 PYTEST_ARGS...}
    family=${3:?usage: lease.sh patched NAME[+NAME] sm87|90 PYTEST_ARGS...}
    shift 3
    for p in ${names//+/ }; do
        git apply -R --check "bench/wip/$p.patch" 2>/dev/null || run git apply "bench/wip/$p.patch" || exit 1
    done
    bash "$0" warm
    GENIE_CUDA_COMPAT=$(compat "$family") run python3 -m pytest -q -n 14 -p no:benchmark -p no:cacheprovider "$@"
    ;;
prefill)
    family=${2:?usage: lease.sh prefill sm87|90}
    GENIE_CUDA_COMPAT=$(compat "$family") GENIE_COMMIT_ARGS="prefill-bf16=--tune,prefill_gemm:3" run bash \
        bench/commits.sh run python3 bench/gpu.py --models gemma4-e2b qwen3-4b qwen3-0.6b --kv int8 --depths 0 --repeats 3
    ;;
*)
    sed -n '2,27p' "$0" >&2
    exit 2
    ;;
esac
