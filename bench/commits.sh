#!/usr/bin/env bash
# A bench command on older commits beside the working tree, in one device call, so that code of different days is
# compared on one machine (between calls the same code moves 5-9 %: bench/NOTES.md v18-v20).
#   here:    bench/commits.sh prepare 48ddce4 7de91dc    # each commit's sources into scratch/commits/<commit>/
#            bench/commits.sh patch dec-heads+dec-global-90  # HEAD with bench/wip's patches applied in that order
#   device:  bench/h200.sh "old:580:bash bench/commits.sh run python3 bench/gpu.py --models qwen3-4b --kv int8"
#            (carry [".whl", "scratch"]; a cold machine compiles the kernels first: the first run takes ~150 s)
# `run` runs the command (one that takes --out, as bench/gpu.py and bench/batch.py do) in the working tree, in
# each prepared commit (only that commit's Python and CUDA sources on its path), then in the working tree
# again, each with an --out of its own. Arguments for one commit only: GENIE_COMMIT_ARGS="48ddce4=--paths,separate"
# (bench/gpu.py before v11 took --paths; commas become spaces).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/tree_path.sh
dir=scratch/commits
case "${1:-}" in
prepare | patch)
    what=$1
    shift
    mkdir -p "$dir"
    for c in "$@"; do
        d="$dir/$c"
        rm -rf "$d" && mkdir -p "$d"
        tree=$c
        if [ "$what" = patch ]; then  # a commit of HEAD with the patches applied, in a throwaway index
            export GIT_INDEX_FILE
            GIT_INDEX_FILE=$(mktemp) && git read-tree HEAD
            for p in ${c//+/ }; do
                git apply --cached "bench/wip/$p.patch" || { rm -rf "$d" "$GIT_INDEX_FILE"; exit 1; }
            done
            tree=$(git write-tree) && rm -f "$GIT_INDEX_FILE" && unset GIT_INDEX_FILE
        fi
        paths=$(for p in workers genie_common bench protocol kvstore tests testkit; do
            git cat-file -e "$tree:$p" 2>/dev/null && echo "$p"; done)
        # shellcheck disable=SC2086
        git archive "$tree" $paths | tar -x -C "$d"
        find "$d" -type f ! -name '*.py' ! -name '*.cu' ! -name '*.cuh' -delete  # no fixtures: the carry is 64 MiB
        find "$d" -path '*/tests/*' -name 'test_*.py' -delete
        echo "$c: $(du -sh "$d" | cut -f1)"
    done
    ;;
run)
    shift
    one() {  # DIR NAME COMMAND...
        local where=$1 name=$2 extra="" kv f
        shift 2
        for kv in ${GENIE_COMMIT_ARGS:-}; do [ "${kv%%=*}" = "$name" ] && extra="${kv#*=}"; done
        echo "### $name"
        if [ "$name" != working-tree ]; then  # the working tree's synthetic files (bench/synthetic.py, seed 0), not written again
            mkdir -p "/tmp/genie-bench-$name"
            for f in /tmp/genie-bench-working-tree/*.gguf; do [ -f "$f" ] && ln -sf "$f" "/tmp/genie-bench-$name/"; done
        fi
        # shellcheck disable=SC2086
        (cd "$where" && PYTHONPATH=/tmp/site:$(tree_path .) timeout 300 "$@" --out "/tmp/genie-bench-$name" ${extra//,/ } 2>&1 | tail -n 30)
    }
    one . working-tree "$@"
    for d in "$dir"/*/; do
        [ -d "$d" ] && one "$d" "$(basename "$d")" "$@"
    done
    one . working-tree "$@"
    ;;
*)
    echo "usage: bench/commits.sh prepare COMMIT... | patch NAME[+NAME]... | run COMMAND..." >&2
    exit 2
    ;;
esac
