"""What the daemon says of its model at once, before the thread has read the file's header."""

from __future__ import annotations

from pathlib import Path

from genie_common.registry import MODELS
from genie_daemon.model_info import known_at_once


def test_a_path_model_has_its_files_size_and_a_packaged_one_its_package_size(tmp_path: Path) -> None:
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"x" * 1234)
    info = known_at_once(str(f))
    assert info.name == "tiny" and info.size == 1234 and info.configured == str(f)
    assert known_at_once("gemma3-270m").size == MODELS["gemma3-270m"].size_bytes
    assert known_at_once(str(tmp_path / "absent.gguf")).size == 0  # the thread's describe says more later
