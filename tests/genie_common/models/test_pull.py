"""`pull` in process, against local servers: the progress it reports, what it does not fetch twice, a file
changed on the server between two runs, cancellation, a second pull of the same name, catalogue pins."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from filelock import FileLock

from genie_common.errors import PullError
from genie_common.models import catalogue
from genie_common.models.catalogue import CatalogueEntry
from genie_common.models.local import ModelsDir
from genie_common.models.pull import PullProgress, part_path, pull
from testkit.tiny_models import write_tiny_model
from tests.genie_common.models.file_server import FileServer, serving


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("no_proxy", "127.0.0.1")


def tiny_bytes(tmp_path: Path, seed: int) -> bytes:
    path = tmp_path / f"seed{seed}.gguf"
    write_tiny_model("llama", path, seed=seed)
    return path.read_bytes()


def test_progress_in_ollamas_words_and_no_second_download(tmp_path: Path) -> None:
    data = tiny_bytes(tmp_path, 0)
    models = ModelsDir(tmp_path / "models")
    with serving(FileServer(files={"/x.gguf": data})) as srv:
        steps: list[PullProgress] = []
        model = pull(f"{srv.url}/x.gguf", models, steps.append)
        statuses = [s.status for s in steps]
        assert statuses[0] == "pulling manifest" and statuses[-3:] == [
            "verifying sha256 digest",
            "writing manifest",
            "success",
        ]
        downloading = [s for s in steps if s.status == "downloading"]
        assert downloading and all(s.total == len(data) for s in downloading)
        assert downloading[-1].completed == len(data)
        assert model.name == "x" and model.sha256 == hashlib.sha256(data).hexdigest()

        again: list[PullProgress] = []
        assert pull(f"{srv.url}/x.gguf", models, again.append) == model
        assert [s.status for s in again] == ["pulling manifest", "success"]
        assert len(srv.gets()) == 1


def test_a_file_changed_on_the_server_starts_over(tmp_path: Path) -> None:
    old, new = tiny_bytes(tmp_path, 0), tiny_bytes(tmp_path, 1)
    assert old != new and len(old) == len(new)
    models = ModelsDir(tmp_path / "models")
    with serving(FileServer(files={"/x.gguf": old}, drop_after_bytes=len(old) // 2)) as srv:
        with pytest.raises(PullError, match="resumes"):
            pull(f"{srv.url}/x.gguf", models)
        srv.files["/x.gguf"], srv.drop_after_bytes = new, None
        model = pull(f"{srv.url}/x.gguf", models)
        assert srv.gets()[-1].headers.get("Range")  # it asked to resume; If-Range made the server send it all
    assert model.path.read_bytes() == new


def test_cancel_keeps_the_part_and_lists_nothing(tmp_path: Path) -> None:
    data = tiny_bytes(tmp_path, 0)
    models = ModelsDir(tmp_path / "models")
    with serving(FileServer(files={"/x.gguf": data})) as srv:
        with pytest.raises(PullError, match="cancelled"):
            pull(f"{srv.url}/x.gguf", models, cancel=lambda: True)
    assert part_path(models, "x").exists()
    assert models.list() == []


def test_a_second_pull_of_the_same_name_is_refused(tmp_path: Path) -> None:
    models = ModelsDir(tmp_path / "models")
    models.ensure()
    with FileLock(str(models.root / ".x.lock")):
        with pytest.raises(PullError, match="another pull of it is running"):
            pull("http://127.0.0.1:9/x.gguf", models)


def test_no_lock_file_stays_however_a_pull_ends(tmp_path: Path) -> None:
    """Failed, cancelled or done, a pull removes its `.NAME.lock` (a failed one left it, 0 bytes)."""
    data = tiny_bytes(tmp_path, 0)
    models = ModelsDir(tmp_path / "models")
    with serving(FileServer(files={"/x.gguf": data, "/bad.gguf": b"not a gguf" * 100})) as srv:
        with pytest.raises(PullError):
            pull(f"{srv.url}/bad.gguf", models)
        with pytest.raises(PullError):
            pull(f"{srv.url}/missing.gguf", models)
        with pytest.raises(PullError, match="cancelled"):
            pull(f"{srv.url}/x.gguf", models, cancel=lambda: True)
        assert [p.name for p in models.root.glob(".*.lock")] == []
        pull(f"{srv.url}/x.gguf", models)
    assert [p.name for p in models.root.glob(".*.lock")] == []


def test_name_override_and_a_bad_name(tmp_path: Path) -> None:
    data = tiny_bytes(tmp_path, 0)
    models = ModelsDir(tmp_path / "models")
    with serving(FileServer(files={"/Weird Name.gguf": data})) as srv:
        assert pull(f"{srv.url}/Weird%20Name.gguf", models).name == "weird-name"
        assert pull(f"{srv.url}/Weird%20Name.gguf", models, name="mine").name == "mine"
        with pytest.raises(PullError, match="not a model name"):
            pull(f"{srv.url}/Weird%20Name.gguf", models, name="Not/ok")
    assert [m.name for m in models.list()] == ["mine", "weird-name"]


def test_another_source_under_the_same_name_replaces_it(tmp_path: Path) -> None:
    a, b = tiny_bytes(tmp_path, 0), tiny_bytes(tmp_path, 1)
    models = ModelsDir(tmp_path / "models")
    with serving(FileServer(files={"/a/x.gguf": a, "/b/x.gguf": b})) as srv:
        pull(f"{srv.url}/a/x.gguf", models)
        model = pull(f"{srv.url}/b/x.gguf", models)
    assert model.source.endswith("/b/x.gguf") and model.path.read_bytes() == b
    assert models.list() == [model]


def test_catalogue_pins_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tiny_bytes(tmp_path, 0)
    right = hashlib.sha256(data).hexdigest()
    models = ModelsDir(tmp_path / "models")
    with serving(FileServer(hf_files={("org/repo", "t.gguf"): data})) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        table = {
            "wrong-sha": CatalogueEntry("org/repo", "t.gguf", "pinned wrong", sha256="cd" * 32),
            "wrong-size": CatalogueEntry("org/repo", "t.gguf", "pinned wrong", size_bytes=len(data) + 1),
            "right": CatalogueEntry("org/repo", "t.gguf", "pinned right", size_bytes=len(data), sha256=right),
        }
        monkeypatch.setattr(catalogue, "CATALOGUE", table)
        monkeypatch.setattr("genie_common.models.sources.CATALOGUE", table)
        with pytest.raises(PullError, match="sha256 is .*, expected cdcd"):
            pull("wrong-sha", models)
        with pytest.raises(PullError, match=f"expected {len(data) + 1}"):
            pull("wrong-size", models)
        model = pull("right", models)
    assert model.name == "right" and model.source == "hf://org/repo/t.gguf" and model.sha256 == right
    assert [m.name for m in models.list()] == ["right"]
