"""The cache directory as a whole: which of its files are genie's entries, and what `genie-ctl kv ls|evict|
clear` do to them (every model's entries).

An entry is a regular file named `*.kv` that begins with genie's magic (format.py). Anything else under
such a name (a symlink, a directory, a FIFO, a stranger's file) is not genie's: it is never followed,
opened blocking, counted against the size cap, evicted, cleared or removed as corrupt, and it is logged
once per name. Before, one such file disabled the store (issue 21 item 4): a self-symlink failed every
scan with ELOOP, a directory stopped eviction and `kv clear` half-way, a FIFO blocked the process in open().

The directory is private (0700: token ids are the conversations' text), also when it already existed,
as long as it is ours to change. One deleted while the store runs holds no entries, and the next save makes
it again (`ensure`), private: before, every lookup failed until a restart (issue 34 item 8).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from .format import EntryError, NotAnEntry, is_genie_file, read_header

log = logging.getLogger("genie.kvstore")

LOCK_TIMEOUT_S = 30.0
ENTRY_ID = re.compile(r"[ct]-[A-Za-z0-9][A-Za-z0-9._-]{0,160}")
NOT_REGULAR = {  # what a `*.kv` that is no regular file is, for the one log line that names it
    stat.S_IFLNK: "a symlink",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


@dataclass(frozen=True)
class EntryFile:
    path: Path
    stat: os.stat_result  # lstat: the file itself, never what a link points to


def make_private(directory: Path) -> None:
    """Creates `directory` 0700, or takes group and others' access away from an existing one we own (one
    made by hand, or by an older genie, may be 0755); another user's is left as it is."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.stat()
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 and st.st_uid == os.geteuid():
        try:
            os.chmod(directory, mode & 0o700)
            log.info("event=kv_dir_made_private dir=%r mode_was=%o", str(directory), mode)
        except OSError as e:  # a read-only file system: saves fail there anyway, each with its reason
            log.warning("event=kv_dir_not_private dir=%r mode=%o error=%r", str(directory), mode, e)


class CacheDir:
    """One process's view of the directory: its lock, and the names it has already logged as not genie's."""

    def __init__(self, path: Path, lock_timeout_s: float = LOCK_TIMEOUT_S) -> None:
        make_private(path)
        self.path = path
        self.lock = FileLock(str(path / ".lock"), timeout=lock_timeout_s)
        self._noted: set[str] = set()  # names logged as left alone
        # name -> (inode, size, is genie's): a file's first bytes are read once, not at every scan
        self._sniffed: dict[str, tuple[int, int, bool]] = {}

    def note(self, name: str, reason: str) -> None:
        """Logs, once per name while the file stays, that a file is left alone."""
        if name not in self._noted:
            self._noted.add(name)
            log.warning("event=kv_left_alone file=%r reason=%r", name, reason)

    def ensure(self) -> None:
        """Makes the directory again, private, when it was deleted since (a save is about to write there)."""
        if not self.path.is_dir():
            make_private(self.path)
            log.warning("event=kv_dir_recreated dir=%r", str(self.path))

    def entry_files(self) -> list[EntryFile]:
        """Genie's entry files now in the directory (every model's; none while it is deleted); every other
        `*.kv` is noted."""
        found, names = [], set()
        for d in self._listing():
            if not d.name.endswith(".kv"):
                continue
            names.add(d.name)
            try:
                st = d.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if self._is_genie(Path(d.path), st):
                found.append(EntryFile(Path(d.path), st))
        self._noted &= names  # a name removed and planted again is logged again
        self._sniffed = {k: v for k, v in self._sniffed.items() if k in names}
        return found

    def _listing(self) -> list[os.DirEntry]:
        """What the directory holds now; nothing while it is deleted."""
        try:
            with os.scandir(self.path) as listing:
                return list(listing)
        except FileNotFoundError:
            return []

    def _is_genie(self, path: Path, st: os.stat_result) -> bool:
        if not stat.S_ISREG(st.st_mode):
            self.note(path.name, f"not a regular file: {NOT_REGULAR.get(stat.S_IFMT(st.st_mode), 'unknown type')}")
            return False
        known = self._sniffed.get(path.name)
        if known is not None and known[:2] == (st.st_ino, st.st_size):
            ours = known[2]
        else:
            try:
                ours = is_genie_file(path)
            except FileNotFoundError:
                return False
            except NotAnEntry as e:  # replaced since the listing
                self.note(path.name, str(e))
                return False
            except OSError as e:  # no read permission: nothing says it is genie's
                self.note(path.name, f"unreadable: {e.strerror}")
                return False
            self._sniffed[path.name] = (st.st_ino, st.st_size, ours)
        if not ours:
            self.note(path.name, "not a genie KV file (its first bytes are not genie's magic)")
        return ours

    def is_entry(self, path: Path) -> bool:
        try:
            return self._is_genie(path, path.lstat())
        except FileNotFoundError:
            return False

    def remove(self, path: Path) -> bool:
        """Unlinks one of genie's files; False when it was already gone or cannot be removed (noted)."""
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return False
        except OSError as e:  # replaced by a directory meanwhile; no write permission
            self.note(path.name, f"cannot be removed: {e.strerror}")
            return False

    def remove_stale_temp(self, older_than_s: float) -> int:
        """Removes temp files older than `older_than_s`: a writer that died mid-save (caller holds the lock).
        Only regular files: a symlink or directory of such a name is not a writer's."""
        cutoff = time.time() - older_than_s
        removed = 0
        for p in self.path.glob(".*.tmp"):
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                removed += self.remove(p)
        return removed

    # -- what genie-ctl kv ls|evict|clear act on --------------------------------------------------------------
    def list_entries(self) -> list[dict[str, object]]:
        """Every entry whose header reads, oldest use first; a bad file is left for the store to reject on use."""
        out = []
        for e in self.entry_files():
            try:
                h = read_header(e.path)
            except EntryError:
                continue
            out.append(
                {
                    "id": e.path.stem,
                    "conv_id": h.conv_id,
                    "tokens": h.n_tokens,
                    "bytes": h.file_bytes,
                    "dtype": h.layout.dtype,
                    "model": h.fingerprint.hex()[:12],
                    "created_ns": h.created_ns,
                    "last_used_ns": e.stat.st_mtime_ns,
                }
            )
        return sorted(out, key=lambda e: (e["last_used_ns"], e["id"]))

    def evict(self, entry_id: str) -> bool:
        """Removes one entry by its id (its file name without .kv); False if there was none."""
        if not ENTRY_ID.fullmatch(entry_id) or ".." in entry_id:
            raise ValueError(
                f"{entry_id[:40]!r} is not an entry id (as `kv ls` shows: c-<conv id>.<tag>, t-<hash>.<tag>)"
            )
        path = self.path / f"{entry_id}.kv"
        with self.lock:
            return self.is_entry(path) and self.remove(path)

    def clear(self) -> int:
        """Removes every entry (every model's); what is not genie's stays."""
        with self.lock:
            return sum(self.remove(e.path) for e in self.entry_files())
