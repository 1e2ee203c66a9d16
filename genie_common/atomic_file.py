"""The one way genie writes a file that others may read: into a temporary name beside it, then renamed.

A reader sees the old file or the whole new one, never a half-written one; a writer that fails or is
killed leaves at most a `.{name}.{pid}.{random}.tmp` behind (and removes it when it can). The temporary
file is created exclusively and not through a symlink, with the given mode.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(target: Path, durable: bool = False, mode: int = 0o644) -> Iterator[Path]:
    """Yields a temporary path to write (the file exists, empty); on a clean exit it replaces `target`.
    `durable` also fsyncs the file and its directory, so the new content survives a power cut once this
    returns."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # pid and a random part: two containers sharing a volume may run writers with the same pid
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode))
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, target)
        if durable:
            fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)


def move_into_place(src: Path, target: Path) -> None:
    """Renames a file already written elsewhere in `target`'s directory (a finished download) over `target`,
    durably: the data is fsynced before the rename and the directory after it, so a power cut leaves the old
    name or the whole new file."""
    with open(src, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(src, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
