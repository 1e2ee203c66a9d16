"""A cache directory on a disk of a few entries, for the KV-store tests that need a full disk without root.

The fault is injected where the store writes an entry (`genie_kvstore.store.write_entry`, the function every save
calls): a write whose entry would not fit beside every file now in the directory (entries, temp files,
anything) raises OSError(ENOSPC), as the kernel's write would; one that fits is the real write. So whatever
frees space (evicting entries, removing a crashed writer's temp files) is the store's own code, measured on
the real files.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import genie_kvstore.store
from genie_kvstore.format import entry_bytes


class SmallDisk:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path, capacity: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self.refused = 0  # writes that met a full disk
        real = genie_kvstore.store.write_entry

        def write_entry(path, fingerprint, layout, snapshot, conv_id="", created_ns=None):
            incoming = entry_bytes(layout, conv_id, snapshot.n_tokens)
            if self.used() + incoming > self.capacity:  # the old file of `path` stays until the rename
                self.refused += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real(path, fingerprint, layout, snapshot, conv_id, created_ns)

        monkeypatch.setattr(genie_kvstore.store, "write_entry", write_entry)

    def used(self) -> int:
        """Bytes of the regular files now in the directory."""
        total = 0
        with os.scandir(self.directory) as listing:
            for d in listing:
                if d.is_file(follow_symlinks=False):
                    total += d.stat(follow_symlinks=False).st_size
        return total
