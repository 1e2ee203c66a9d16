#!/usr/bin/env bash
# The add-on's entry point: Home Assistant's options become /data/genie.toml, then this process becomes
# genie-daemon (mode local) or a plain TCP forwarder to genie on another host (mode forward).
set -euo pipefail

DATA=${ADDON_DATA:-/data} # the add-on's persistent volume (a test points ADDON_DATA elsewhere)
OPTIONS=$DATA/options.json
CONFIG=$DATA/genie.toml
# HOME on the persistent volume: the default model is assembled into ~/.cache on first start and the CPU
# kernels compile into ~/.cache/genie/kernels; both survive restarts and are left out of backups
export HOME=$DATA/home
mkdir -p "$HOME"

# prints `local`, or `forward HOST PORT`; a bad option exits 2 with one line naming it
plan=$(python3 -m genie_daemon.addon_options "$OPTIONS" "$CONFIG")
read -r mode host port <<<"$plan"
case "$mode" in
    local) exec genie-daemon --config "$CONFIG" ;;
    forward) exec python3 -m genie_daemon.tcp_forward --listen-port 11434 "$host" "$port" ;;
    *)
        echo "run.sh: unexpected plan from genie_daemon.addon_options: $plan" >&2
        exit 1
        ;;
esac
