"""Where pulled models live by default, in a module of its own: the daemon's config reads it, and
genie-ctl, which loads that config, must not pay for the GGUF reader to learn a path."""

from __future__ import annotations

import os
from pathlib import Path


def default_models_dir() -> Path:
    """`GENIE_MODELS_DIR`, else `$XDG_DATA_HOME/genie/models`, else `~/.local/share/genie/models`."""
    override = os.environ.get("GENIE_MODELS_DIR")
    if override:
        return Path(override).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "genie" / "models"
