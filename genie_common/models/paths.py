"""Where pulled models live by default, in a module of its own: the daemon's config reads it, and
genie-ctl, which loads that config, must not pay for the GGUF reader to learn a path."""

from __future__ import annotations

from pathlib import Path

from genie_common import env


def default_models_dir() -> Path:
    """`GENIE_MODELS_DIR`, else `$XDG_DATA_HOME/genie/models`, else `~/.local/share/genie/models`."""
    return env.models_dir_override() or env.data_home() / "genie" / "models"
