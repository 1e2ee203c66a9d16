"""`pull`: fetch a model into the models directory, telling progress in Ollama's words.

The steps: "pulling manifest" (what SOURCE names; for Hugging Face a HEAD that tells the size and sha256),
"downloading" (bytes into `.{name}.part`, resumed when an earlier pull was cut), "verifying sha256 digest"
(and the GGUF: ModelsDir.add), "writing manifest", "success". A model already present from the same
source is not fetched again, and a Hugging Face file already in huggingface_hub's cache is copied from
there. Two pulls of one name never write the same `.part`: the second is refused.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import PullError
from ..held_file import Held, HeldFile
from .download import download, note_path, probe_hf
from .local import LocalModel, ModelsDir, is_valid_name
from .sources import Source, parse_source

PROGRESS_INTERVAL_S = 0.25  # "downloading" reports at most this often (and always the last bytes)


@dataclass(frozen=True)
class PullProgress:
    """One step of a pull, as Ollama's /api/pull streams it."""

    status: str  # "pulling manifest", "downloading", "verifying sha256 digest", "writing manifest", "success"
    total: int | None = None  # bytes of the file, when known
    completed: int | None = None  # bytes on disk so far
    digest: str | None = None  # "sha256:…" when known before the download


def part_path(models: ModelsDir, name: str) -> Path:
    """Where an unfinished download of `name` waits to be resumed."""
    return models.root / f".{name}.part"


def _lock_path(models: ModelsDir, name: str) -> Path:
    return models.root / f".{name}.lock"


def remove_partial(models: ModelsDir, name: str) -> bool:
    """Drops an unfinished download of `name`; True if there was one."""
    if not is_valid_name(name):
        return False
    part = part_path(models, name)
    found = part.exists()
    part.unlink(missing_ok=True)
    note_path(part).unlink(missing_ok=True)
    return found


def _is_current(model: LocalModel, src: Source) -> bool:
    return model.source == src.source and src.sha256 in (None, model.sha256)


def _hf_cached(src: Source, commit: str | None) -> Path | None:
    """The file in huggingface_hub's own cache (`HF_HUB_CACHE`, ~/.cache/huggingface/hub), at the commit
    the server named (else the cache's `main`), when another tool already fetched it."""
    if src.hf_file is None:
        return None
    from huggingface_hub import try_to_load_from_cache

    repo, filename = src.hf_file
    found = try_to_load_from_cache(repo, filename, revision=commit)
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def _copy_cached(cached: Path, part: Path, what: str, report: Callable[[int, int | None], None]) -> None:
    """Copies a cached file to the part (ModelsDir.add then checks it like any download)."""
    total = cached.stat().st_size
    try:
        shutil.copyfile(cached, part)  # the cache's entry is a link to its blob: the bytes are copied
    except OSError as e:
        part.unlink(missing_ok=True)
        raise PullError(f"{what}: cannot copy it from the Hugging Face cache ({cached}): {e.strerror or e}") from None
    report(total, total)


def pull(
    source: str,
    models: ModelsDir | None = None,
    progress: Callable[[PullProgress], None] = lambda p: None,
    name: str | None = None,
    cancel: Callable[[], bool] = lambda: False,
) -> LocalModel:
    """Fetches SOURCE (catalogue name, hf://OWNER/REPO/FILE.gguf, http(s) URL) as `name` (default: the
    catalogue name or the file's stem) and returns it; PullError on any failure."""
    models = models if models is not None else ModelsDir()
    src = parse_source(source)
    name = name if name is not None else src.name
    if not is_valid_name(name):
        raise PullError(f"{name!r} is not a model name: lowercase letters, digits, '.', '_' and '-'")
    progress(PullProgress("pulling manifest"))
    existing = models.get(name)
    if existing is not None and _is_current(existing, src):
        progress(PullProgress("success"))
        return existing
    try:
        models.ensure()
        lock = HeldFile(_lock_path(models, name))  # removed again however the pull ends
    except Held as e:
        raise PullError(f"{name}: another pull of it is running ({e})") from None
    except OSError as e:
        raise PullError(f"{src.source}: cannot write to {models.root}: {e.strerror or e}") from None
    with lock:
        return _pull_locked(src, name, models, progress, cancel)


def _pull_locked(
    src: Source,
    name: str,
    models: ModelsDir,
    progress: Callable[[PullProgress], None],
    cancel: Callable[[], bool],
) -> LocalModel:
    url, size, sha256 = src.url, src.size_bytes, src.sha256
    remote = None
    if src.is_hf:
        remote = probe_hf(src.url, src.source)
        url = remote.url
        size = size if size is not None else remote.size_bytes
        sha256 = sha256 if sha256 is not None else remote.sha256
    digest = f"sha256:{sha256}" if sha256 else None
    last_report = [0.0]

    def report(completed: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last_report[0] >= PROGRESS_INTERVAL_S or completed == total:
            last_report[0] = now
            progress(PullProgress("downloading", total if total is not None else size, completed, digest))

    part = part_path(models, name)
    cached = _hf_cached(src, remote.commit) if remote is not None else None
    if cached is not None:  # huggingface_hub already fetched this very file: copied, never downloaded again
        _copy_cached(cached, part, src.source, report)
    else:
        # a part is continued only for the same file: the same URL (commit-pinned on Hugging Face) and digest
        download(url, part, f"{url} {sha256 or ''}", src.source, size, report, cancel)
    got = part.stat().st_size
    if size is not None and got != size:
        remove_partial(models, name)
        raise PullError(f"{src.source}: got {got} bytes, expected {size}")
    progress(PullProgress("verifying sha256 digest", digest=digest))
    try:
        model = models.add(part, name, src.source, sha256)  # deletes the part when it is refused
    finally:
        note_path(part).unlink(missing_ok=True)
    # add() wrote the manifest durably before returning; the step is reported as Ollama's clients expect it
    progress(PullProgress("writing manifest"))
    progress(PullProgress("success"))
    return model
