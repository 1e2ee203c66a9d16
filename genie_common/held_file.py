"""A lock file that exists only while it is held: an exclusive `flock` on it, the holder's pid in it, and
the file removed when it is let go (a pull that failed used to leave a 0-byte `.NAME.lock` behind in the
models directory, issue 34 item 17). The kernel lets go of a dead holder's lock, so a file a killed
process left is taken over by the next one."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class Held(Exception):
    """Another process holds the lock; `pid` is its pid when it had written it."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is held by {f'pid {pid}' if pid else 'another process'}")
        self.path, self.pid = path, pid


class HeldFile:
    def __init__(self, path: str | Path) -> None:
        """Takes the lock now, without waiting: Held when another process has it."""
        self.path = Path(path)
        self._fd = _take(self.path)

    def release(self) -> None:
        """Removes the file, then lets the lock go: in this order, a process that opens the path meanwhile
        either finds the lock held or makes a new file of its own."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> HeldFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _take(path: Path) -> int:
    """An fd holding the flock on `path`, with this process's pid written in it. The file is checked to be
    the one at the path once the lock is taken: a lock on a file its holder has just removed holds nothing."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            raise Held(path, pid) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # removed by the holder that let go after we opened it: take the new one


def _holder(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None
