#!/usr/bin/env bash
# Copy the Home Assistant add-on (deploy/homeassistant) into an add-ons folder, with a wheel of this
# checkout of genie in its wheels/ for the Dockerfile: e.g. the `addons` share of a Home Assistant OS
# host (Samba or SSH add-on), mounted here, as DEST=/mnt/addons/genie. Then in Home Assistant:
# Settings -> Add-ons -> Add-on store -> (menu) Check for updates; "genie" appears under Local add-ons.
set -euo pipefail

if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: deploy/stage-addon.sh DEST   (e.g. /mnt/addons/genie)" >&2
    exit 2
fi
DEST=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}

wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
"$PYTHON" -m pip wheel --no-deps --disable-pip-version-check --wheel-dir "$wheel_dir" "$(dirname "$HERE")"

mkdir -p "$DEST"
cp -R "$HERE/homeassistant/." "$DEST/"
rm -f "$DEST"/wheels/genie-*.whl
cp "$wheel_dir"/genie-*.whl "$DEST/wheels/"
echo "stage-addon.sh: the add-on is in $DEST ($(basename "$DEST"/wheels/genie-*.whl))"
