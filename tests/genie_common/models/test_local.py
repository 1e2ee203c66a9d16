"""The models directory (genie_common/models/local.py): where it is, what add() accepts and refuses, and that
list() shows only complete models."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import gguf
import numpy as np
import pytest

from genie_common.errors import GenieError, PullError
from genie_common.models.local import ModelsDir, default_models_dir, name_for_file
from testkit.tiny_models import write_tiny_model


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "download.tmp"
    write_tiny_model("llama", path)
    return path


def test_default_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GENIE_MODELS_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert default_models_dir() == tmp_path / "home" / ".local" / "share" / "genie" / "models"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_models_dir() == tmp_path / "data" / "genie" / "models"
    monkeypatch.setenv("GENIE_MODELS_DIR", str(tmp_path / "mine"))
    assert default_models_dir() == tmp_path / "mine"
    assert ModelsDir().root == tmp_path / "mine"


def test_names_from_files() -> None:
    assert name_for_file("Qwen3-4B-Q4_K_M.gguf") == "qwen3-4b-q4_k_m"
    assert name_for_file("sub/dir/My Model (v2).GGUF") == "my-model-v2"
    assert name_for_file("x.gguf") == "x"


def test_add_list_get_remove(tmp_path: Path, tiny: Path) -> None:
    models = ModelsDir(tmp_path / "models")
    assert models.list() == [] and not models.root.exists()
    model = models.add(tiny, "tiny", "http://example/tiny.gguf")
    assert not tiny.exists()  # renamed, not copied
    assert stat.S_IMODE(models.root.stat().st_mode) == 0o700
    assert (model.architecture, model.quant, model.context, model.has_chat_template) == ("llama", "F32", 512, False)
    assert model.path == models.root / "tiny.gguf" and model.size_bytes == model.path.stat().st_size
    assert models.list() == [model] and models.get("tiny") == model
    d = model.as_dict()
    assert json.loads(json.dumps(d)) == d and d["path"] == str(model.path)
    manifest = json.loads((models.root / "tiny.json").read_text())
    assert manifest["sha256"] == model.sha256 and manifest["source"] == "http://example/tiny.gguf"
    assert models.remove("tiny") is True
    assert models.remove("tiny") is False
    assert models.list() == [] and sorted(p.name for p in models.root.iterdir()) == []


def test_list_is_sorted_by_name(tmp_path: Path) -> None:
    models = ModelsDir(tmp_path / "models")
    for name in ("b", "a", "c"):
        write_tiny_model("llama", tmp_path / f"{name}.tmp")
        models.add(tmp_path / f"{name}.tmp", name, name)
    assert [m.name for m in models.list()] == ["a", "b", "c"]


def test_wrong_sha256_is_refused_and_the_file_deleted(tmp_path: Path, tiny: Path) -> None:
    models = ModelsDir(tmp_path / "models")
    with pytest.raises(PullError, match="sha256 is [0-9a-f]{64}, expected 00+$") as info:
        models.add(tiny, "tiny", "src", sha256="0" * 64)
    assert isinstance(info.value, GenieError) and "\n" not in str(info.value)
    assert not tiny.exists()
    assert models.list() == []


def test_a_right_sha256_is_accepted(tmp_path: Path, tiny: Path) -> None:
    import hashlib

    digest = hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert ModelsDir(tmp_path / "models").add(tiny, "tiny", "src", sha256=digest.upper()).sha256 == digest


def test_an_architecture_genie_cannot_run_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bert.tmp"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(PullError, match="architecture 'bert' is not one genie runs"):
        ModelsDir(tmp_path / "models").add(path, "bert", "src")
    assert not path.exists()


def test_a_bad_name_is_refused(tmp_path: Path, tiny: Path) -> None:
    models = ModelsDir(tmp_path / "models")
    with pytest.raises(PullError, match="not a model name"):
        models.add(tiny, "../escape", "src")
    assert not tiny.exists()
    assert models.get("../escape") is None and models.remove("../escape") is False


def test_incomplete_models_are_skipped_and_logged_once(
    tmp_path: Path, tiny: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models = ModelsDir(tmp_path / "models")
    models.add(tiny, "good", "src")
    for name in ("gone", "short"):
        write_tiny_model("llama", tmp_path / "t")
        models.add(tmp_path / "t", name, "src")
    (models.root / "gone.gguf").unlink()
    with open(models.root / "short.gguf", "r+b") as f:
        f.truncate(1000)
    (models.root / "broken.json").write_text("{not json")
    (models.root / "partial.json").write_text(json.dumps({"size_bytes": 1}))
    with caplog.at_level(logging.WARNING, logger="genie.models"):
        assert [m.name for m in models.list()] == ["good"]
        assert [m.name for m in models.list()] == ["good"]
    skipped = [r.getMessage() for r in caplog.records if "model_skipped" in r.getMessage()]
    assert len(skipped) == 4, skipped
    assert models.get("gone") is None and models.get("short") is None
