"""One file over HTTP into a `.part` that survives an interruption: the next run resumes it with a Range
request (and If-Range, so a file changed on the server starts over instead of being spliced).

A `.part` sits beside a small JSON note of what it is a part of (the URL and the server's validator);
a part of anything else is discarded, never continued.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..atomic_file import atomic_path
from ..errors import PullError

TIMEOUT_S = 30.0  # per connect and per read: a stalled server fails the pull (the .part stays)
CHUNK_BYTES = 1 << 20
MAX_HF_REDIRECTS = 5
FREE_SPACE_MARGIN_BYTES = 64 << 20  # the manifest, the directory, and not filling the disk to the last byte
USER_AGENT = f"genie/{__version__}"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RemoteFile:
    """What a Hugging Face resolve HEAD says about a file."""

    url: str  # the URL to GET: pinned to the commit when the server named one
    size_bytes: int | None
    sha256: str | None  # LFS files: their sha256 (X-Linked-Etag); small git files have a sha1 ETag, not this
    commit: str | None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the resolve answer's own headers are the ones wanted, not the CDN's


def _request(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> urllib.request.Request:
    return urllib.request.Request(url, method=method, headers={"User-Agent": USER_AGENT, **(headers or {})})


def _etag(value: str | None) -> str | None:
    if not value:
        return None
    return value.removeprefix("W/").strip('"')


def probe_hf(url: str, what: str) -> RemoteFile:
    """HEADs a resolve URL without following the redirect to the file's storage, as huggingface_hub does;
    a redirect within the same server (a renamed repository) is followed."""
    opener = urllib.request.build_opener(_NoRedirect)
    for _ in range(MAX_HF_REDIRECTS):
        try:
            resp = opener.open(_request(url, "HEAD"), timeout=TIMEOUT_S)
            status, headers = resp.status, resp.headers
            resp.close()
        except urllib.error.HTTPError as e:
            status, headers = e.code, e.headers
            e.close()
            if status not in (301, 302, 303, 307, 308):
                raise PullError(f"{what}: HTTP {status} {e.reason} from {url}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PullError(f"{what}: cannot reach {url}: {_reason(e)}") from None
        location = headers.get("Location")
        commit = headers.get("X-Repo-Commit")
        if status in (301, 302, 303, 307, 308) and commit is None and location and location.startswith("/"):
            url = urllib.parse.urljoin(url, location)
            continue
        etag = _etag(headers.get("X-Linked-Etag") or headers.get("ETag"))
        size = headers.get("X-Linked-Size") or headers.get("Content-Length")
        pinned = url.replace("/resolve/main/", f"/resolve/{commit}/", 1) if commit else url
        return RemoteFile(
            url=pinned,
            size_bytes=int(size) if size and size.isdigit() else None,
            sha256=etag if etag and _SHA256.fullmatch(etag) else None,
            commit=commit,
        )
    raise PullError(f"{what}: more than {MAX_HF_REDIRECTS} redirects from {url}")


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
    return str(reason)


@dataclass
class _PartNote:
    """What a `.part` is a part of."""

    key: str  # the URL and the digest expected, as pull gives them
    validator: str | None = None  # the server's ETag or Last-Modified, sent back as If-Range


def _read_note(path: Path) -> _PartNote | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return _PartNote(str(raw["key"]), raw.get("validator"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_note(path: Path, note: _PartNote) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"key": note.key, "validator": note.validator}))


def note_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def download(
    url: str,
    part: Path,
    key: str,
    what: str,
    size_bytes: int | None,
    progress: Callable[[int, int | None], None],
    cancel: Callable[[], bool],
) -> None:
    """Fetches `url` into `part`, continuing what an earlier run of the same `key` left there.
    `progress(completed, total)` follows each chunk; PullError when the server or the connection fails
    (the part is kept for the next run) or `cancel()` turns true."""
    note_file = note_path(part)
    note = _read_note(note_file)
    have = part.stat().st_size if part.exists() else 0
    if note is None or note.key != key or (size_bytes is not None and have > size_bytes):
        have = 0
        note = _PartNote(key)
        part.unlink(missing_ok=True)
        note_file.unlink(missing_ok=True)  # written again once the server answers
    if size_bytes is not None and have == size_bytes:
        return  # a run before finished the bytes and stopped before checking them
    if size_bytes is not None:
        _check_free_space(part.parent, size_bytes - have, what)
    headers = {}
    if have:
        headers["Range"] = f"bytes={have}-"
        if note.validator:
            headers["If-Range"] = note.validator
    try:
        resp = urllib.request.urlopen(_request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        total = _range_total(e.headers.get("Content-Range"))
        e.close()
        if e.code == 416 and have and total == have:
            return  # already whole
        if e.code == 416:
            part.unlink(missing_ok=True)
            raise PullError(f"{what}: the server refused to resume at byte {have}; pull again to start over") from None
        raise PullError(f"{what}: HTTP {e.code} {e.reason} from {url}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PullError(f"{what}: cannot reach {url}: {_reason(e)}") from None
    with resp:
        total = _expected_total(resp, have, what)
        if resp.status != 206:
            have = 0  # the server sent the whole file: start over
        validator = resp.headers.get("ETag") or resp.headers.get("Last-Modified")
        if validator != note.validator or not note_file.exists():
            _write_note(note_file, _PartNote(key, validator))
        if total is not None and resp.status != 206:
            _check_free_space(part.parent, total, what)
        _copy(resp, part, have, total, what, progress, cancel)


def _range_total(content_range: str | None) -> int | None:
    m = re.fullmatch(r"bytes \*/(\d+)", content_range or "")
    return int(m.group(1)) if m else None


def _expected_total(resp: http.client.HTTPResponse, have: int, what: str) -> int | None:
    if resp.status == 206:
        m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
        if m is None or int(m.group(1)) != have:
            raise PullError(f"{what}: the server resumed at the wrong place ({resp.headers.get('Content-Range')!r})")
        return int(m.group(3)) if m.group(3) != "*" else None
    length = resp.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


def _check_free_space(directory: Path, needed_bytes: int, what: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed_bytes + FREE_SPACE_MARGIN_BYTES:
        raise PullError(f"{what}: needs {needed_bytes / 1e9:.2f} GB in {directory}, {free / 1e9:.2f} GB free")


def _copy(
    resp: http.client.HTTPResponse,
    part: Path,
    have: int,
    total: int | None,
    what: str,
    progress: Callable[[int, int | None], None],
    cancel: Callable[[], bool],
) -> None:
    done = have
    with open(part, "r+b" if have else "wb") as f:
        f.seek(have)
        f.truncate()
        progress(done, total)
        while True:
            if cancel():
                raise PullError(f"{what}: cancelled after {done} bytes (kept: pulling it again resumes)")
            try:
                chunk = resp.read(CHUNK_BYTES)
            except (http.client.IncompleteRead, OSError) as e:
                f.write(getattr(e, "partial", b""))
                raise PullError(
                    f"{what}: connection lost after {f.tell()} of {total or '?'} bytes (kept: pulling it again resumes)"
                ) from None
            if not chunk:
                break
            f.write(chunk)
            done += len(chunk)
            progress(done, total)
    if total is not None and done != total:
        raise PullError(f"{what}: the server sent {done} of {total} bytes (kept: pulling it again resumes)")
