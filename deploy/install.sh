#!/usr/bin/env bash
# Install genie as a systemd service: a `genie` system user, a venv in /opt/genie/venv, the unit
# /etc/systemd/system/genie.service and, only when it is absent, /etc/genie/genie.toml. Running it again
# upgrades the package and the unit and leaves an existing genie.toml as it is.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: deploy/install.sh [--dry-run] [--root DIR] [--source PATH|SPEC] [--no-start] [--skip-pip]
  --dry-run       print every action, change nothing
  --root DIR      install into DIR (a scratch root) with every path under it; useradd, usermod, chown
                  and systemctl are printed, not run
  --source S      what pip installs: a path or a requirement, e.g. '/src/genie[gpu]' for CuPy
                  (default: the repository this script is in)
  --no-start      enable the service but do not (re)start it
  --skip-pip      make the venv but install nothing into it (for tests: the service cannot run)
environment: PYTHON, the interpreter for the venv (default: python3; 3.11 or newer)
EOF
}

say() { printf 'install.sh: %s\n' "$*"; }
die() {
    printf 'install.sh: error: %s\n' "$*" >&2
    exit 1
}
show() { # the command as a shell would take it, with a note after it
    local line
    printf -v line ' %q' "$@"
    printf '+%s%s\n' "$line" "${NOTE:-}"
}
run() { # changes files (under --root when given)
    show "$@"
    if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}
on_host() { # changes the host system itself: never with --root
    if [ -n "$ROOT" ]; then NOTE="   # not run: --root" show "$@"; else run "$@"; fi
}

HERE=$(cd "$(dirname "$0")" && pwd)
DRY_RUN=0 ROOT="" START=1 SKIP_PIP=0
SOURCE=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
VENV=/opt/genie/venv
UNIT=/etc/systemd/system/genie.service
CONF=/etc/genie/genie.toml

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --root | --source)
            [ $# -ge 2 ] || die "$1 needs a value"
            if [ "$1" = --root ]; then ROOT=$2; else SOURCE=$2; fi
            shift
            ;;
        --root=*) ROOT=${1#--root=} ;;
        --source=*) SOURCE=${1#--source=} ;;
        --no-start) START=0 ;;
        --skip-pip) SKIP_PIP=1 ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            usage >&2
            die "unknown option: $1"
            ;;
    esac
    shift
done

# --- checks: nothing is changed before they all pass ---
if [ -n "$ROOT" ]; then
    [ -d "$ROOT" ] || die "--root $ROOT is not a directory"
    ROOT=$(cd "$ROOT" && pwd)
    [ "$ROOT" != / ] || die "--root / is the host itself: leave --root out"
elif [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
    die "run as root (or try --dry-run, or --root DIR)"
fi
if [ -z "$ROOT" ] && [ "$DRY_RUN" = 0 ] && ! command -v systemctl >/dev/null; then
    die "systemctl not found: this installs a systemd service"
fi
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON=/path/to/python3.11+)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than Python 3.11"
base_python=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable))')
case "$base_python" in
    /home/* | /root/*)
        # the venv links to its base interpreter, which the unit's ProtectHome=yes hides from the service
        msg="$base_python is under /home or /root, hidden from the service by ProtectHome=yes: set PYTHON to a system python"
        if [ -z "$ROOT" ] && [ "$DRY_RUN" = 0 ]; then die "$msg"; else say "warning: $msg"; fi
        ;;
esac
case "$SOURCE" in
    /* | ./* | ../*) # a path, perhaps with extras: /src/genie[gpu]
        [ -e "${SOURCE%%\[*}" ] || die "--source $SOURCE: no such file or directory"
        ;;
esac

# --- the genie user; the video and render groups own the GPU device nodes on some systems (Jetson) ---
if [ -z "$ROOT" ] && getent passwd genie >/dev/null; then
    say "user genie exists"
else
    nologin=$(command -v nologin || echo /usr/sbin/nologin)
    on_host useradd --system --user-group --home-dir /var/lib/genie --no-create-home --shell "$nologin" genie
fi
for group in video render; do
    if getent group "$group" >/dev/null && ! id -nG genie 2>/dev/null | tr ' ' '\n' | grep -qx "$group"; then
        on_host usermod -a -G "$group" genie
    fi
done

# --- the venv and the package ---
if [ -x "$ROOT$VENV/bin/python" ]; then
    say "venv $ROOT$VENV exists"
elif [ "$SKIP_PIP" = 1 ]; then
    run "$PYTHON" -m venv --without-pip "$ROOT$VENV"
else
    run "$PYTHON" -m venv "$ROOT$VENV"
fi
if [ "$SKIP_PIP" = 1 ]; then
    say "skipping pip install $SOURCE (--skip-pip)"
else
    run "$ROOT$VENV/bin/python" -m pip install --upgrade --disable-pip-version-check "$SOURCE"
fi

# --- the unit (ours: replaced when it differs) and the config (the admin's: written only when absent) ---
if cmp -s "$HERE/systemd/genie.service" "$ROOT$UNIT"; then
    say "$ROOT$UNIT is up to date"
else
    run install -D -m 0644 "$HERE/systemd/genie.service" "$ROOT$UNIT"
fi
if [ -e "$ROOT$CONF" ] || [ -L "$ROOT$CONF" ]; then
    say "$ROOT$CONF exists: left as it is"
else
    run install -D -m 0640 "$HERE/systemd/genie.toml" "$ROOT$CONF"
    on_host chown root:genie "$ROOT$CONF" # readable by the service, which may hold the API key
fi

# --- systemd-analyze verify: under --root, with the unit's /opt/genie paths pointed into DIR ---
if ! command -v systemd-analyze >/dev/null; then
    say "systemd-analyze not found: the unit is not verified"
elif [ "$DRY_RUN" = 1 ]; then
    show systemd-analyze verify "$ROOT$UNIT"
elif [ -n "$ROOT" ]; then
    check_dir=$(mktemp -d)
    trap 'rm -rf "$check_dir"' EXIT
    unit_text=$(<"$ROOT$UNIT")
    printf '%s\n' "${unit_text//\/opt\/genie\//$ROOT/opt/genie/}" >"$check_dir/genie.service"
    run systemd-analyze verify "$check_dir/genie.service"
else
    run systemd-analyze verify "$UNIT"
fi

# --- enable, (re)start ---
on_host systemctl daemon-reload
on_host systemctl enable genie.service
if [ "$START" = 1 ]; then
    on_host systemctl restart genie.service
    if [ -z "$ROOT" ] && [ "$DRY_RUN" = 0 ]; then
        say "started: journalctl -u genie -f; curl http://127.0.0.1:11434/health answers 200 once the model is loaded"
    fi
else
    say "not started (--no-start): systemctl start genie"
fi
