"""The KV cache directory: save at turn end, find the longest saved prefix of a prompt, hydrate it, and
keep the directory under its size cap — safely with several processes on one directory.

Entries are files (format.py): `c-<conv id>.kv` for a conversation that has an id, `t-<hash>.kv` for one
found from its tokens alone (Home Assistant sends no id). An in-memory index maps chained hashes of
64-token chunks to entries, so a prompt finds every entry sharing at least its first chunk; the match is
then verified token by token, and the file's checksum is verified before any of it is served.

Recency is the file's mtime: a save writes it, a hydrate touches it. A save runs under one `filelock` lock
on the directory: it first removes stale temp files (a crashed writer's), then evicts (least recently used
first) until the entries and the new one fit `max_bytes`, then writes its temp file and renames it into
place (atomic_path). A disk that fills up below the cap (ENOSPC, EDQUOT) evicts as many bytes as the new entry needs,
least recently used first, and the write is tried once more. A save that still fails is a value
(NotSaved), counted and logged: the store goes on. Other processes' saves and evictions are picked up by
rescanning when the directory's mtime changes. What in the directory is genie's, and what is left alone,
is cache_dir.py's.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from genie_common.config import KV_CACHE_MAX_MB, KV_CACHE_STALE_TMP_S
from genie_common.kv_types import KVSnapshot
from genie_protocol.schema import CONV_ID

from .cache_dir import CacheDir, EntryFile
from .format import (
    EntryError,
    EntryHeader,
    EntryUnavailable,
    ForeignEntryError,
    KVLayout,
    NotAnEntry,
    check_compatible,
    entry_bytes,
    read_entry,
    read_header,
    write_entry,
)

log = logging.getLogger("genie.kvstore")

CHUNK_TOKENS = 64
HYDRATE_UNAVAILABLE_TRIES = 3  # an entry that is kept but cannot be read now: tries before a miss
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # a write that evicting entries can make room for
OTHER_NAMES = 3  # names an entry may take besides its own, when something not genie's holds that (a directory)


@dataclass(frozen=True)
class StoreConfig:
    directory: Path
    max_bytes: int = KV_CACHE_MAX_MB << 20  # total size of the entries; 0 = unlimited
    stale_tmp_s: float = KV_CACHE_STALE_TMP_S  # temp files older than this are a crashed writer's: removed
    min_hydrate_tokens: int = 1  # shorter common prefixes are never served (the caller's policy.py decides more)


@dataclass(frozen=True)
class Match:
    header: EntryHeader
    n_tokens: int  # verified common prefix with the prompt


@dataclass(frozen=True)
class Saved:
    path: Path
    bytes: int


@dataclass(frozen=True)
class NotSaved:
    """A save that was not written; `code` is the ERROR code the worker gets (protocol/SPEC.md)."""

    code: str  # kv_too_large: larger than the whole cap; kv_io: the disk refused it (full, read-only, gone)
    message: str


@dataclass
class StoreMetrics:
    hits: int = 0
    misses: int = 0
    hydrated_tokens: int = 0
    saved_bytes: int = 0
    saves: int = 0
    evictions: int = 0  # to the size cap, or for room on a full disk
    rejected: int = 0
    skipped: int = 0  # saves larger than the whole cap
    save_failures: int = 0  # saves the disk refused (after making room on a full one), or with no name free

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class _Entry:
    header: EntryHeader
    inode: int  # a re-save renames a new file into place: a new inode
    chain: list[bytes] = field(default_factory=list)  # chained chunk hashes of its tokens


def check_conv_id(conv_id: str) -> str:
    """A conversation id becomes a file name: letters, digits, '.', '_', '-'; 1-128 characters; no path."""
    if not CONV_ID.fullmatch(conv_id) or ".." in conv_id:
        raise ValueError(f"conv id {conv_id[:40]!r} is not 1-128 of A-Z a-z 0-9 . _ - (starting alphanumeric)")
    return conv_id


def chunk_chain(token_ids: np.ndarray | list[int]) -> list[bytes]:
    """h[i] = hash(h[i-1], tokens of chunk i) for every full chunk: equal h[i] means equal first i+1 chunks."""
    ids = np.asarray(token_ids, dtype="<i4")
    chain, prev = [], b""
    for i in range(len(ids) // CHUNK_TOKENS):
        prev = hashlib.blake2b(prev + ids[i * CHUNK_TOKENS : (i + 1) * CHUNK_TOKENS].tobytes(), digest_size=16).digest()
        chain.append(prev)
    return chain


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class KVStore:
    def __init__(
        self, config: StoreConfig, fingerprint: bytes, layout: KVLayout, files: CacheDir | None = None
    ) -> None:
        """`files`: the process's view of the directory, shared by its stores (one per model and layout)
        so that each file left alone is logged once."""
        self.config = config
        self.fingerprint = fingerprint
        self.layout = layout
        self.files = files or CacheDir(config.directory)
        self.dir = self.files.path
        # this model's and layout's entries carry its tag: daemons of other models (or the same model with
        # the other KV dtype) sharing the directory never write the same names
        self.tag = hashlib.sha256(fingerprint + repr(layout).encode()).hexdigest()[:8]
        self.lock = self.files.lock
        self.metrics = StoreMetrics()
        self._entries: dict[str, _Entry] = {}  # file name -> entry
        self._by_chunk: dict[bytes, set[str]] = {}
        self._dir_mtime_ns = -1
        self._placed_elsewhere: set[str] = set()  # own names held by something not genie's (logged once each)
        self._refresh()

    # -- index ------------------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Re-reads the directory if it changed since the last look (another process saved or evicted); a
        directory deleted meanwhile holds nothing (the next save makes it again)."""
        try:
            mtime = self.dir.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        if mtime == self._dir_mtime_ns and mtime != -1:
            return
        self._dir_mtime_ns = mtime
        files = self.files.entry_files()
        for gone in set(self._entries) - {f.path.name for f in files}:
            self._forget(gone)
        for f in files:
            name = f.path.name
            known = self._entries.get(name)
            if known and known.inode == f.stat.st_ino:
                continue
            self._forget(name)
            try:
                header = read_header(f.path)
                check_compatible(header, self.fingerprint, self.layout)
            except NotAnEntry as e:  # replaced since the listing
                self.files.note(name, str(e))
                continue
            except ForeignEntryError:
                continue  # another model's entry (two daemons may share the directory): not ours to serve or delete
            except EntryError as e:
                self._reject(f.path, e)
                continue
            self._add(name, header, f.stat.st_ino)

    def _add(self, name: str, header: EntryHeader, inode: int) -> None:
        entry = _Entry(header, inode, chunk_chain(header.token_ids))
        self._entries[name] = entry
        for h in entry.chain:
            self._by_chunk.setdefault(h, set()).add(name)

    def _forget(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry:
            for h in entry.chain:
                names = self._by_chunk.get(h)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._by_chunk[h]

    def _reject(self, path: Path, error: EntryError) -> None:
        """A bad file is never served. One of genie's that fails a check is logged and deleted; one that is
        not this model's, or not genie's at all, is left alone (logged once); one that could not be read
        now, or was replaced since its header was read, is only forgotten (the next look reads it again)."""
        self._forget(path.name)
        if isinstance(error, EntryUnavailable):
            log.warning("event=kv_unavailable file=%r reason=%r", path.name, str(error))
            self._dir_mtime_ns = -1
            return
        self.metrics.rejected += 1
        if isinstance(error, ForeignEntryError):
            self.files.note(path.name, str(error))
            return
        log.warning("event=kv_rejected file=%r reason=%r", path.name, str(error))
        self.files.remove(path)

    # -- lookup and hydrate -----------------------------------------------------------------------------
    def lookup(self, token_ids: list[int] | np.ndarray, conv_id: str = "", longer_than: int = 0) -> Match | None:
        """The entry sharing the longest verified token prefix with `token_ids` (the conversation's own entry
        when `conv_id` names one, or any entry found by its chunks), or None when none shares more than
        `longer_than` tokens (what the caller already holds) and at least min_hydrate_tokens."""
        self._refresh()
        prompt = np.asarray(token_ids, dtype=np.int32)
        candidates: list[EntryHeader] = []
        if conv_id:
            for name in self._names("c", check_conv_id(conv_id)):
                path = self.dir / name
                if not path.exists():
                    continue
                try:
                    header = read_header(path)
                    check_compatible(header, self.fingerprint, self.layout)
                    candidates.append(header)
                except EntryError as e:  # a miss; another model's file, or a stranger's, stays
                    self._reject(path, e)
        chain = chunk_chain(prompt)
        for h in reversed(chain):
            names = self._by_chunk.get(h)
            if names:
                candidates += [self._entries[n].header for n in names]
                break
        best: Match | None = None
        for header in candidates:
            n = common_prefix(header.token_ids, prompt)
            if n >= self.config.min_hydrate_tokens and n > longer_than and (best is None or n > best.n_tokens):
                best = Match(header, n)
        return best

    def load(self, match: Match) -> KVSnapshot | None:
        """Positions [0, match.n_tokens) of the entry, or None (logged, file removed) if it fails any check;
        counts as a use for eviction."""
        try:
            snapshot = read_entry(match.header, match.n_tokens)
        except EntryError as e:
            self._reject(match.header.path, e)
            return None
        try:
            os.utime(match.header.path, follow_symlinks=False)
        except FileNotFoundError:
            pass  # evicted by another process after we read it: what we read was whole and checked
        self.metrics.hits += 1
        self.metrics.hydrated_tokens += match.n_tokens
        return snapshot

    def hydrate(self, token_ids: list[int] | np.ndarray, conv_id: str = "", longer_than: int = 0) -> KVSnapshot | None:
        """lookup + load: the longest saved prefix of `token_ids` as a snapshot, or None (a miss). An entry
        that fails its checks on load is removed, and the next best one tried."""
        unavailable = 0
        while (match := self.lookup(token_ids, conv_id, longer_than)) is not None:
            snapshot = self.load(match)  # a bad entry is removed from disk and index: this ends
            if snapshot is not None:
                return snapshot
            if match.header.path.exists() and (unavailable := unavailable + 1) >= HYDRATE_UNAVAILABLE_TRIES:
                break  # kept (unreadable now, or replaced under us) and still failing: a miss this time
        self.metrics.misses += 1
        return None

    def _name(self, kind: str, key: str) -> str:
        return f"{kind}-{key}.{self.tag}.kv"

    def _names(self, kind: str, key: str) -> list[str]:
        """An entry's own name, then the ones it takes when something not genie's holds that: `c-den.<tag>-1.kv`
        and on (a conversation's own name always ends in `.<tag>.kv`, so none is another's)."""
        return [self._name(kind, key)] + [f"{kind}-{key}.{self.tag}-{i}.kv" for i in range(1, OTHER_NAMES + 1)]

    def _place(self, names: list[str]) -> str | None:
        """The first of an entry's names that is free or holds one of genie's entries (to be replaced); a
        directory, a symlink, a FIFO or a stranger's file there is never replaced: before, a directory planted
        at a conversation's name failed its every save (issue 34 item 10). Caller holds the lock."""
        for name in names:
            path = self.dir / name
            if not os.path.lexists(path) or self.files.is_entry(path):
                if name != names[0] and names[0] not in self._placed_elsewhere:
                    self._placed_elsewhere.add(names[0])
                    log.warning("event=kv_saved_as file=%r instead_of=%r: that name is not genie's", name, names[0])
                return name
        return None

    # -- save -------------------------------------------------------------------------------------------
    def save(self, snapshot: KVSnapshot, conv_id: str = "") -> Saved | NotSaved:
        """Writes the snapshot durably (returns once it is safe on disk) within the size cap. NotSaved when the
        entry alone would exceed the cap (saving it would only evict everything else), when the disk refused
        it even after making room, or when no name of it is free; a conv id that is no file name raises
        ValueError (the request's fault)."""
        ids = np.asarray(snapshot.token_ids, dtype=np.int32)
        if conv_id:
            names = self._names("c", check_conv_id(conv_id))
        else:
            names = self._names("t", hashlib.blake2b(ids.astype("<i4").tobytes(), digest_size=16).hexdigest())
        try:
            self.files.ensure()  # before the lock, whose file is in it: deleted at run time (issue 34 item 8)
            with self.lock:
                result = self._save_locked(snapshot, conv_id, names)
        except OSError as e:  # the disk's (full even after eviction, read-only, failing) or the lock's: not ours
            log.error("event=kv_save_failed file=%r error=%r", names[0], e)
            result = NotSaved("kv_io", f"{type(e).__name__}: {e}")
        if isinstance(result, Saved):
            self.metrics.saves += 1
            self.metrics.saved_bytes += result.bytes
        elif result.code == "kv_too_large":
            self.metrics.skipped += 1
        else:
            self.metrics.save_failures += 1
        return result

    def _save_locked(self, snapshot: KVSnapshot, conv_id: str, names: list[str]) -> Saved | NotSaved:
        # first, whatever becomes of this save: a crashed writer's temp files hold space the save may need, and
        # swept only after a write they stayed for good once a full disk failed every save (issue 34 item 11)
        self.files.remove_stale_temp(self.config.stale_tmp_s)
        ids = np.asarray(snapshot.token_ids, dtype=np.int32)
        size = entry_bytes(self.layout, conv_id, len(ids))
        if 0 < self.config.max_bytes < size:
            log.warning("event=kv_save_skipped bytes=%d max_bytes=%d", size, self.config.max_bytes)
            return NotSaved("kv_too_large", f"{size} bytes, larger than the cap {self.config.max_bytes}")
        name = self._place(names)
        if name is None:
            return NotSaved("kv_name_taken", f"files not genie's hold every name of the entry {names[0]!r}")
        if not conv_id:  # first: what the new entry supersedes makes room, not some other conversation
            self._drop_superseded(name, ids)
        # room is made before the write, for its size, and the write runs under the lock: writers that each
        # made room after writing held the directory at up to 1.8x the cap meanwhile (issue 21 item 8)
        self._make_room(size, name)
        previous = next((self._entries[n] for n in names if n in self._entries), None)
        created = previous.header.created_ns if previous is not None else None
        size = self._write(self.dir / name, snapshot, conv_id, created, size)
        for other in names:  # an older copy under another of its names is superseded
            if other != name and self.files.is_entry(self.dir / other) and self.files.remove(self.dir / other):
                self._forget(other)
        return Saved(self.dir / name, size)

    def _write(self, path: Path, snapshot: KVSnapshot, conv_id: str, created: int | None, size: int) -> int:
        """write_entry; on a full disk below the cap (issue 34 item 7: every later save failed, nothing was
        evicted), evicts entries for the new one's size and writes once more (caller holds the lock)."""
        try:
            return write_entry(path, self.fingerprint, self.layout, snapshot, conv_id, created)
        except OSError as e:
            if e.errno not in DISK_FULL or not self._free_disk(size, path.name):
                raise
            log.warning("event=kv_disk_full file=%r bytes=%d: evicted for room, writing again", path.name, size)
        return write_entry(path, self.fingerprint, self.layout, snapshot, conv_id, created)

    def _drop_superseded(self, name: str, ids: np.ndarray) -> None:
        """An anonymous entry whose tokens all begin the new one is of no further use."""
        self._refresh()
        for other, entry in list(self._entries.items()):
            h = entry.header
            if other != name and other.startswith("t-") and h.n_tokens <= len(ids):  # (the index: this tag only)
                if common_prefix(h.token_ids, ids) == h.n_tokens:
                    self.files.remove(self.dir / other)
                    self._forget(other)

    def _make_room(self, incoming_bytes: int, name: str) -> None:
        """Least recently used first, evicts entries (every model's) until they and a new one of
        `incoming_bytes` fit max_bytes; `name`, which the new one replaces, is not counted (caller holds the
        lock)."""
        if self.config.max_bytes <= 0:
            return
        files = [f for f in self.files.entry_files() if f.path.name != name]
        total = incoming_bytes + sum(f.stat.st_size for f in files)
        for f in sorted(files, key=lambda f: (f.stat.st_mtime_ns, f.path.name)):
            if total <= self.config.max_bytes:
                break
            self._evict(f, "cap")
            total -= f.stat.st_size

    def _free_disk(self, needed_bytes: int, name: str) -> int:
        """A full disk: evicts entries (every model's) least recently used first until `needed_bytes` are
        freed; `name`, which the new entry replaces anyway, goes last. The bytes freed (caller holds the lock)."""
        files = self.files.entry_files()
        freed = 0
        for f in sorted(files, key=lambda f: (f.path.name == name, f.stat.st_mtime_ns, f.path.name)):
            if freed >= needed_bytes:
                break
            if self._evict(f, "disk_full"):
                freed += f.stat.st_size
        return freed

    def _evict(self, f: EntryFile, reason: str) -> bool:
        removed = self.files.remove(f.path)
        if removed:
            self.metrics.evictions += 1
            log.info("event=kv_evicted file=%r bytes=%d reason=%s", f.path.name, f.stat.st_size, reason)
        self._forget(f.path.name)
        return removed

    # -- admin ------------------------------------------------------------------------------------------
    def entries(self) -> list[dict[str, object]]:
        return self.files.list_entries()

    def evict(self, entry_id: str) -> bool:
        existed = self.files.evict(entry_id)
        self._forget(f"{entry_id}.kv")
        return existed

    def clear(self) -> int:
        n = self.files.clear()
        self._refresh()
        return n
