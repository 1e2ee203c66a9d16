# shellcheck shell=bash
# Sourced by bench/h200.sh and bench/commits.sh, which run a tree of sources without installing it: its
# folders under the names an installed genie has (pyproject.toml's package-dir: workers/ is genie_workers,
# protocol/ genie_protocol, kvstore/ genie_kvstore), as links in a folder of their own.
#   PYTHONPATH=$(tree_path DIR)    prints that folder and DIR, for PYTHONPATH
tree_path() {
    local tree names p
    tree=$(cd "$1" && pwd)
    names=$(mktemp -d /tmp/genie-names.XXXXXX)
    for p in workers protocol kvstore; do
        if [ -d "$tree/$p" ]; then ln -s "$tree/$p" "$names/genie_$p"; fi
    done
    echo "$names:$tree"
}
