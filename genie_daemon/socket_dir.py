"""The daemon's socket directory: held by one daemon at a time, private to its user whatever the umask.

A second daemon given the same directory used to bind over the first one's sockets (ZeroMQ unlinks an ipc
path before binding it): the first went on running, unreachable, or the second served in its place with a
second worker beside the first's (issue 34 item 1). Now a daemon holds an exclusive `flock` on
`genie.lock` in the directory for as long as it runs; another one finds it held and refuses to start,
naming the holder's pid, before it touches anything. The kernel releases the lock of a daemon that dies,
so the sockets a killed daemon left are taken over as before.

The directory is made 0700 (0750 with `socket_group`, whose members may then use the client socket), also
when it existed already (a user's `mkdir`, systemd's RuntimeDirectory= at its default 0755), as long as it
is the daemon user's. Each socket gets its mode after it is bound: the client socket 0600 (0660 with
`socket_group`), every other 0600 (issue 34 item 4: under umask 002 every member of the group could run
requests on the worker behind the daemon's back, or read saved KV through the store).
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import stat
from pathlib import Path

from genie_common.held_file import Held, HeldFile

log = logging.getLogger("genie.daemon")

LOCK_NAME = "genie.lock"
PRIVATE_SOCKET_MODE = 0o600  # the worker's, the KV store's and genie-ctl's sockets: the daemon's user only


class DirectoryInUse(Exception):
    """Another daemon holds the directory."""


class SocketDir:
    def __init__(self, path: str | Path, group: str = "") -> None:
        """Takes the directory (DirectoryInUse when another daemon holds it), then makes it private.
        `group`: the group whose members may use the client socket (ValueError when it does not exist or
        the daemon's user cannot give the directory to it)."""
        self.path = Path(path)
        self.group = group
        self.gid = _group_id(group) if group else None
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            self._lock: HeldFile | None = HeldFile(self.path / LOCK_NAME)
        except Held as e:
            who = f"pid {e.pid}" if e.pid else "another process"
            raise DirectoryInUse(
                f"another genie-daemon ({who}) is serving {self.path}: stop it first "
                f"(genie-ctl --socket-dir {self.path} stop) or give this one another --socket-dir"
            ) from None
        try:
            self._make_private()
        except BaseException:
            self.release()
            raise

    @property
    def client_mode(self) -> int:
        """The client socket's mode: the group's members may connect when there is a group."""
        return 0o660 if self.gid is not None else PRIVATE_SOCKET_MODE

    def set_mode(self, endpoint: str, mode: int = PRIVATE_SOCKET_MODE) -> None:
        """Gives a socket the daemon bound its mode (and the group, for the client socket's 0660)."""
        if not endpoint.startswith("ipc://"):
            return
        sock = endpoint[len("ipc://") :]
        if mode & 0o070 and self.gid is not None:
            os.chown(sock, -1, self.gid)
        os.chmod(sock, mode)

    def _make_private(self) -> None:
        st = self.path.stat()
        if st.st_uid != os.geteuid():  # not ours to change: sockets are still set to their modes
            log.warning("event=socket_dir_not_ours dir=%r uid=%d mode=%o", str(self.path), st.st_uid, st.st_mode)
            return
        if self.gid is not None and st.st_gid != self.gid:
            try:
                os.chown(self.path, -1, self.gid)
            except PermissionError:
                message = f"socket_group = {self.group!r}: cannot give {self.path} to it (not a member?)"
                raise ValueError(message) from None
        mode = 0o750 if self.gid is not None else 0o700
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(self.path, mode)
            log.info("event=socket_dir_mode dir=%r mode=%o mode_was=%o", str(self.path), mode, stat.S_IMODE(st.st_mode))

    def release(self, endpoints: list[str] | tuple[str, ...] = ()) -> None:
        """Removes the socket files of `endpoints` (a file left behind looks like a daemon to genie-ctl),
        then lets the directory go: in this order, a daemon starting meanwhile either finds the directory
        held or has nothing of this one's left to lose."""
        if self._lock is None:
            return
        for endpoint in endpoints:
            if endpoint.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    os.unlink(endpoint[len("ipc://") :])
        self._lock.release()
        self._lock = None


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"socket_group = {group!r}: no such group") from None
