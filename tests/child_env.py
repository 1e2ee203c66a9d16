"""The environment for a child process a test starts: this checkout first on PYTHONPATH, whatever the
parent already had on it kept after (a machine whose packages live on PYTHONPATH, such as the GPU
machine's carried wheels, would otherwise lose them in the child)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    inherited = os.environ.get("PYTHONPATH")
    path = str(ROOT) if not inherited else f"{ROOT}{os.pathsep}{inherited}"
    return {**os.environ, **extra, "PYTHONPATH": path}
