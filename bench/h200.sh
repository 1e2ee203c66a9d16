#!/usr/bin/env bash
# One call on the GPU machine (the device tool, which sets $OUT): install the carried wheels (carry `.whl`,
# made by ../shared/tools/device-wheels.sh), then run each argument as a stage under its own time limit, so a
# hung kernel costs that stage only; each stage's output goes to $OUT/NAME.log.
#   bench/h200.sh "NAME:LIMIT_S:COMMAND" ...     e.g. "tests:200:python3 -m pytest -q tests/workers/engine/backends/test_cupy_backend.py"
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
source bench/tree_path.sh
PYTHONPATH=/tmp/site:$(tree_path .) PYTHONUNBUFFERED=1
export PYTHONPATH PYTHONUNBUFFERED
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
for stage in "$@"; do
    name=${stage%%:*}
    rest=${stage#*:}
    limit=${rest%%:*}
    cmd=${rest#*:}
    echo "== $name ($limit s): $cmd"
    timeout "$limit" bash -c "$cmd" > "$out/$name.log" 2>&1
    echo "== $name exit $?"
    tail -n 40 "$out/$name.log"
done
