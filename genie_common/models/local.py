"""The models directory: pulled GGUF files, each beside a small JSON manifest that says what it is.

`{root}/{name}.gguf` is the model, `{root}/{name}.json` its manifest; a model is listed only when both are
there and the file has the manifest's size, so a half-finished add or a file deleted by hand never shows.
Everything else in the directory (a download's `.part`, a temporary file) is left alone.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import re
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from ..atomic_file import atomic_path, move_into_place
from ..errors import ModelFileError, PullError
from ..families import architecture_names
from ..gguf_file import GGUFFile
from .paths import default_models_dir

log = logging.getLogger("genie.models")

MANIFEST_SUFFIX = ".json"
MODEL_SUFFIX = ".gguf"
# short, lowercase, safe as a file name and in a URL path: "qwen3-0.6b", "smollm2-135m-instruct.q4_1"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
HASH_CHUNK_BYTES = 1 << 20

__all__ = [
    "LocalModel",
    "ModelsDir",
    "PullError",
    "default_models_dir",
    "gguf_summary",
    "is_valid_name",
    "name_for_file",
]


def is_valid_name(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None and not name.endswith((MODEL_SUFFIX, MANIFEST_SUFFIX))


def name_for_file(filename: str) -> str:
    """The short name a file gets when no catalogue name applies: its stem, lowercased, odd characters `-`."""
    stem = filename.rsplit("/", 1)[-1]
    if stem.lower().endswith(MODEL_SUFFIX):
        stem = stem[: -len(MODEL_SUFFIX)]
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:100]
    return name or "model"


@dataclass(frozen=True)
class LocalModel:
    """One model of the directory, as its manifest describes it."""

    name: str
    path: Path
    size_bytes: int
    sha256: str
    source: str  # what it was pulled from: a catalogue name, hf://…, a URL
    architecture: str  # general.architecture
    quant: str  # the file type, llama.cpp's words: Q4_K_M, Q8_0, F16
    context: int  # training context in tokens (0 when the file does not say)
    has_chat_template: bool
    added_at: str  # ISO 8601, UTC

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def _quant(gf: GGUFFile) -> str:
    ftype = gf.get("general.file_type")
    if isinstance(ftype, int) and not isinstance(ftype, bool):
        try:
            return LlamaFileType(ftype).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    # no file type written: name it after the type holding most of the bytes
    by_type: Counter[str] = Counter()
    for t in gf.tensors.values():
        by_type[t.qtype.name] += t.n_bytes
    return by_type.most_common(1)[0][0] if by_type else "unknown"


def gguf_summary(gf: GGUFFile) -> dict[str, Any]:
    """The manifest's facts about an open GGUF: architecture, quant, context, has_chat_template."""
    arch = gf.architecture
    context = gf.get(f"{arch}.context_length", 0)
    return {
        "architecture": arch,
        "quant": _quant(gf),
        "context": int(context) if isinstance(context, int) and not isinstance(context, bool) else 0,
        "has_chat_template": isinstance(gf.get("tokenizer.chat_template"), str),
    }


def describe_gguf(path: Path, source: str) -> dict[str, Any]:
    """What the manifest says about a GGUF file; PullError when genie could not run it."""
    try:
        with GGUFFile(path) as gf:  # checks the header and that every tensor lies inside the file
            summary = gguf_summary(gf)
    except ModelFileError as e:
        raise PullError(f"{source}: {e.problem}") from None
    if summary["architecture"] not in architecture_names():
        known = ", ".join(architecture_names())
        raise PullError(f"{source}: architecture {summary['architecture']!r} is not one genie runs ({known})")
    return summary


class ModelsDir:
    """The models directory of this machine (or of `root`): list, get, add and remove models."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_models_dir()
        self._noted: set[str] = set()  # manifests already logged as skipped

    def model_path(self, name: str) -> Path:
        return self.root / f"{name}{MODEL_SUFFIX}"

    def manifest_path(self, name: str) -> Path:
        return self.root / f"{name}{MANIFEST_SUFFIX}"

    def ensure(self) -> Path:
        """Creates the directory (0700: what a user pulled is theirs) and returns it."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700, exist_ok=True)
        return self.root

    def _note(self, name: str, reason: str) -> None:
        if name not in self._noted:
            self._noted.add(name)
            log.warning("event=model_skipped manifest=%r reason=%r", name, reason)

    def _load(self, name: str) -> LocalModel | None:
        manifest = self.manifest_path(name)
        try:
            raw = json.loads(manifest.read_text(encoding="utf-8"))
            model = LocalModel(
                name=name,
                path=self.model_path(name),
                size_bytes=int(raw["size_bytes"]),
                sha256=str(raw["sha256"]),
                source=str(raw["source"]),
                architecture=str(raw["architecture"]),
                quant=str(raw["quant"]),
                context=int(raw["context"]),
                has_chat_template=bool(raw["has_chat_template"]),
                added_at=str(raw["added_at"]),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._note(manifest.name, f"unreadable manifest: {e}")
            return None
        try:
            size = model.path.stat().st_size
        except OSError:
            self._note(manifest.name, f"{model.path.name} is missing")
            return None
        if size != model.size_bytes:
            self._note(manifest.name, f"{model.path.name} has {size} bytes, the manifest says {model.size_bytes}")
            return None
        return model

    def list(self) -> builtins.list[LocalModel]:
        """Every complete model, sorted by name."""
        try:
            names = sorted(
                p.name[: -len(MANIFEST_SUFFIX)]
                for p in self.root.iterdir()
                if p.name.endswith(MANIFEST_SUFFIX) and is_valid_name(p.name[: -len(MANIFEST_SUFFIX)])
            )
        except FileNotFoundError:
            return []
        return [m for m in map(self._load, names) if m is not None]

    def get(self, name: str) -> LocalModel | None:
        if not is_valid_name(name):
            return None
        return self._load(name)

    def remove(self, name: str) -> bool:
        """Removes the model's manifest (it stops being listed), then its file; False when there was neither."""
        if not is_valid_name(name):
            return False
        removed = False
        for path in (self.manifest_path(name), self.model_path(name)):
            try:
                path.unlink()
                removed = True
            except FileNotFoundError:
                pass
        return removed

    def add(self, gguf_tmp: Path, name: str, source: str, sha256: str | None = None) -> LocalModel:
        """Checks `gguf_tmp` (its sha256 when given; always its GGUF header and that every tensor lies inside
        it), renames it into place durably and writes its manifest. On failure `gguf_tmp` is deleted and
        PullError says why."""
        try:
            if not is_valid_name(name):
                raise PullError(f"{name!r} is not a model name: lowercase letters, digits, '.', '_' and '-'")
            digest = file_sha256(gguf_tmp)
            if sha256 is not None and digest != sha256.lower():
                raise PullError(f"{source}: sha256 is {digest}, expected {sha256.lower()}")
            info = describe_gguf(gguf_tmp, source)
            self.ensure()
            target = self.model_path(name)
            # the old manifest goes first: while the file is replaced, nothing describes it
            self.manifest_path(name).unlink(missing_ok=True)
            if gguf_tmp.resolve().parent == self.root.resolve():
                move_into_place(gguf_tmp, target)
            else:  # another directory may be another file system, where a rename cannot reach
                with atomic_path(target, durable=True) as tmp:
                    shutil.copyfile(gguf_tmp, tmp)
                gguf_tmp.unlink()
            model = LocalModel(
                name=name,
                path=target,
                size_bytes=target.stat().st_size,
                sha256=digest,
                source=source,
                added_at=datetime.now(UTC).isoformat(timespec="seconds"),
                **info,
            )
            manifest = {k: v for k, v in model.as_dict().items() if k not in ("name", "path")}
            with atomic_path(self.manifest_path(name), durable=True) as tmp:
                tmp.write_text(json.dumps({"name": name, "file": target.name, **manifest}, indent=1) + "\n")
            return model
        except OSError as e:  # disk full, permissions: a failed pull too, said in one line
            gguf_tmp.unlink(missing_ok=True)
            raise PullError(f"{source}: cannot add to {self.root}: {e.strerror or e}") from None
        except BaseException:
            gguf_tmp.unlink(missing_ok=True)
            raise
