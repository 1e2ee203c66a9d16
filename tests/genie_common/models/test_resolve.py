"""`-m NAME` (registry.resolve_model) finds pulled models first, and says how to pull one it cannot find."""

from __future__ import annotations

from pathlib import Path

import pytest

from genie_common.errors import ModelNotFoundError
from genie_common.models.local import ModelsDir
from genie_common.registry import installed_path, resolve_model
from testkit.tiny_models import write_tiny_model


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelsDir:
    monkeypatch.setenv("GENIE_MODELS_DIR", str(tmp_path / "models"))
    return ModelsDir()


def test_a_pulled_name_resolves_to_its_file(tmp_path: Path, models: ModelsDir) -> None:
    write_tiny_model("llama", tmp_path / "t")
    model = models.add(tmp_path / "t", "tiny", "src")
    assert resolve_model("tiny") == model.path == installed_path("tiny")


def test_a_pulled_name_shadows_the_pypi_one(tmp_path: Path, models: ModelsDir) -> None:
    write_tiny_model("llama", tmp_path / "t")
    model = models.add(tmp_path / "t", "smollm2-135m", "src")
    assert resolve_model("smollm2-135m", progress=lambda _: None) == model.path


def test_paths_still_resolve_as_paths(tmp_path: Path, models: ModelsDir) -> None:
    assert resolve_model(str(tmp_path / "missing.gguf")) == tmp_path / "missing.gguf"


def test_not_found_names_genie_pull(models: ModelsDir) -> None:
    with pytest.raises(ModelNotFoundError, match="`genie pull qwen3-4b` fetches it"):
        resolve_model("qwen3-4b")
    with pytest.raises(ModelNotFoundError, match=r"`genie pull` fetches one \(qwen3-4b.*hf://"):
        resolve_model("no-such-model")
