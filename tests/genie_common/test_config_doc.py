"""docs/configuration.md states every option of DaemonConfig with its current default and every environment
variable genie_common/env.py reads: the reference cannot drift from the code silently."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

from genie_common.config import DaemonConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "configuration.md").read_text("utf-8")


def test_every_option_is_documented_with_its_default():
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `(\w+)` \| `GENIE_\w+` \|.*$", DOC, re.M)}
    names = [f.name for f in fields(DaemonConfig)]
    assert sorted(rows) == sorted(names)
    for f in fields(DaemonConfig):
        assert f"`GENIE_{f.name.upper()}`" in rows[f.name]
        if f.default is not MISSING:  # a computed default (a directory) is described in words
            assert f"`{f.default!r}`" in rows[f.name], f.name


def test_every_environment_variable_read_is_documented():
    source = (ROOT / "genie_common" / "env.py").read_text("utf-8")
    read = set(re.findall(r"os\.environ(?:\.get|\.setdefault)?\(\"(\w+)\"", source))
    assert read >= {"XDG_CACHE_HOME", "CC", "GENIE_CPU_THREADS", "GENIE_CUDA_COMPAT"}  # the pattern finds them
    for name in read | {"XDG_RUNTIME_DIR"}:
        assert f"| `{name}` |" in DOC, name
