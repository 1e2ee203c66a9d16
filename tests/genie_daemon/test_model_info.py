"""What the daemon says of its model at once, before the thread has read the file's header."""

from __future__ import annotations

from pathlib import Path

from genie_common.models.local import ModelsDir
from genie_common.registry import MODELS
from genie_daemon.model_info import describe, known_at_once
from testkit.tiny_models import write_tiny_model


def test_a_path_model_has_its_files_size_and_a_packaged_one_its_package_size(tmp_path: Path) -> None:
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"x" * 1234)
    info = known_at_once(str(f))
    assert info.name == "tiny" and info.size == 1234 and info.configured == str(f)
    assert known_at_once("gemma3-270m").size == MODELS["gemma3-270m"].size_bytes
    assert known_at_once(str(tmp_path / "absent.gguf")).size == 0  # the thread's describe says more later


def test_what_a_model_lacks_is_known_once_its_header_is_read(tmp_path: Path) -> None:
    """Before the header is read nothing is refused (the worker renders what the template takes); a file
    read without a chat template does neither tools nor thinking, one with Qwen3's does both."""
    assert not known_at_once("gemma3-270m").lacks("tools")
    plain, qwen = tmp_path / "plain.gguf", tmp_path / "qwen.gguf"
    write_tiny_model("llama", plain)
    template = (Path(__file__).resolve().parents[2] / "testkit/fixtures/templates/Qwen-Qwen3-0.6B.jinja").read_text()
    write_tiny_model("qwen3", qwen, chat_template=template)
    models = ModelsDir(tmp_path / "none")
    assert describe(str(plain), models).lacks("tools") and describe(str(plain), models).lacks("thinking")
    assert describe(str(qwen), models).capabilities == ("completion", "tools", "thinking")
