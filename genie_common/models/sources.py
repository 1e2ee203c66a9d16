"""What `genie pull SOURCE` fetches: a catalogue name, `hf://OWNER/REPO/FILE.gguf` or an http(s) URL.

Hugging Face files are fetched over plain HTTP from `$HF_ENDPOINT/{repo}/resolve/{revision}/{file}` (the
API huggingface_hub uses; `HF_ENDPOINT` defaults to https://huggingface.co), so one downloader with one
resumable `.part` in the models directory serves every kind of source.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from .. import env
from ..errors import PullError
from .catalogue import CATALOGUE
from .local import name_for_file

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
HF_SCHEME = "hf://"
HF_REVISION = "main"


def hf_endpoint() -> str:
    return (env.hf_endpoint() or DEFAULT_HF_ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class Source:
    """One parsed SOURCE."""

    source: str  # canonical form, kept in the manifest: hf://… for catalogue names, else as given
    url: str  # what is fetched (a Hugging Face resolve URL for hf:// and catalogue names)
    name: str  # the short name the model gets unless --name says otherwise
    is_hf: bool  # the URL is a resolve URL: a HEAD tells the commit, size and sha256
    sha256: str | None = None  # pinned by the catalogue
    size_bytes: int | None = None  # pinned by the catalogue
    description: str = ""
    hf_file: tuple[str, str] | None = None  # (repository, file) of a Hugging Face source


def _hf(repo: str, filename: str) -> str:
    return f"{hf_endpoint()}/{repo}/resolve/{HF_REVISION}/{quote(filename)}"


def parse_source(text: str) -> Source:
    """The Source `text` names; PullError when it names none."""
    entry = CATALOGUE.get(text)
    if entry is not None:
        return Source(
            entry.hf_source,
            _hf(entry.repo, entry.filename),
            text,
            True,
            entry.sha256,
            entry.size_bytes,
            entry.description,
            (entry.repo, entry.filename),
        )
    if text.startswith(HF_SCHEME):
        parts = text[len(HF_SCHEME) :].split("/")
        if len(parts) < 3 or not all(parts):
            raise PullError(f"{text!r}: an hf:// source is hf://OWNER/REPO/FILE.gguf")
        repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
        return Source(text, _hf(repo, filename), name_for_file(filename), True, hf_file=(repo, filename))
    split = urlsplit(text)
    if split.scheme in ("http", "https") and split.netloc:
        return Source(text, text, name_for_file(unquote(split.path)), False)
    known = ", ".join(CATALOGUE)
    raise PullError(f"{text!r} is not a catalogue model ({known}), hf://OWNER/REPO/FILE.gguf or an http(s):// URL")
