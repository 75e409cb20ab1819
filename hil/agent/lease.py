"""The agent's lease on its host: an flock the agent holds for its whole life. Python 3.9+, standard library.

At start the agent locks ``<remote tmp>/pytest-san-lease-<inventory host name>.lock`` with
``flock(LOCK_EX | LOCK_NB)`` and keeps the descriptor open until it exits. The kernel drops the lock
with the last descriptor, so a dead agent, controller or SSH connection frees the host at once:
there is no stale lock to clean by hand. The holder (controller, pid, worker, run, since) is written
into the file for whoever finds the host busy; the lock, not the text, is what counts.

The descriptor is close-on-exec and the agent never forks without exec, so no child keeps the lock.

The file sits in a directory others can write (``/tmp``), so it is opened without following a symlink
and without blocking, and checked on the open descriptor before anything is written: a FIFO, a file of
another user or one with a second hard link (which would make a root agent overwrite another file) is
refused with a message naming the file, and the agent reports that in its hello instead of serving.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from datetime import datetime, timezone
from typing import Any

PREFIX = "pytest-san-lease-"
_READ_TRIES = 40  # x 25 ms: a holder writes its record right after it got the lock


def now_iso() -> str:
    """Local time with its UTC offset, to the millisecond (what lease records carry)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def lock_path(directory: str, host: str) -> str:
    """The lock file of inventory host ``host``; names outside ``[A-Za-z0-9._-]`` get a hash suffix."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "_"
    if safe != host:
        safe += "-" + hashlib.sha256(host.encode()).hexdigest()[:8]
    return os.path.join(directory, f"{PREFIX}{safe}.lock")


class Lease:
    """A held lease: the open, locked descriptor and the record written into the file."""

    def __init__(self, fd: int, path: str, holder: dict[str, Any]) -> None:
        self.fd = fd
        self.path = path
        self.holder = holder

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the lock goes with the descriptor
            self.fd = -1


class LeaseRefused(Exception):
    """The lease file cannot be used safely; the message names the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"lease file {path} {problem}")
        self.path = path


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link"))
_REMOVE = "; remove it (or give this host a san_remote_tmp of its own)"


def _check(fd: int, path: str) -> bool:
    """Whether the open file is safe to lock and rewrite (False: it was unlinked under us, open it again)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise LeaseRefused(path, f"is {kind}, not a regular file{_REMOVE}")
    if st.st_uid != os.geteuid():
        raise LeaseRefused(path, f"is owned by uid {st.st_uid}, not by the agent's uid {os.geteuid()}: "
                                 f"someone else may have planted it{_REMOVE}")
    if st.st_nlink == 0:
        return False
    if st.st_nlink != 1:
        raise LeaseRefused(path, f"has {st.st_nlink} hard links: another name of the same file would be "
                                 f"overwritten{_REMOVE}")
    return True


def _open_once(path: str, base: int) -> tuple[int, bool] | None:
    """(descriptor, writable), or None if the file appeared or vanished between two opens."""
    try:
        return os.open(path, base | os.O_RDWR), True
    except FileNotFoundError:
        try:
            # Readable by all (whoever finds the host busy may look); a lease file of another user is
            # refused, so users sharing a host need a san_remote_tmp each (their pushes need it anyway).
            fd = os.open(path, base | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None  # someone created it between our two opens
        return fd, True
    except PermissionError:
        # Our own file without write permission: flock works read-only.
        return os.open(path, base | os.O_RDONLY), False


def _open(path: str) -> tuple[int, bool]:
    """(descriptor, writable) of a regular file of our own with one link; LeaseRefused otherwise.

    Never follows a symlink and never blocks (a FIFO planted there would); creates the file if missing.
    Everything is checked on the open descriptor before a byte is written.
    """
    base = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    for _ in range(10):
        try:
            opened = _open_once(path, base)
        except PermissionError:
            if not os.path.lexists(path):
                raise LeaseRefused(path, f"cannot be created: permission denied in its directory (the agent "
                                         f"runs as uid {os.geteuid()})") from None
            raise LeaseRefused(path, f"cannot be opened: permission denied (the agent runs as uid "
                                     f"{os.geteuid()}){_REMOVE}") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LeaseRefused(path, f"is a symbolic link{_REMOVE}") from None
            raise LeaseRefused(path, f"cannot be opened: {exc.strerror or exc}") from None
        if opened is None:
            continue
        fd, writable = opened
        try:
            if _check(fd, path):
                return fd, writable
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise LeaseRefused(path, "keeps appearing and disappearing")


def read_holder(fd: int) -> dict[str, Any]:
    """The record in a lease file; ``{}`` if none could be read."""
    for _ in range(_READ_TRIES):
        data = os.pread(fd, 65536, 0)
        if data.strip():
            try:
                record = json.loads(data)
            except ValueError:
                record = None  # being written right now
            if isinstance(record, dict):
                return record
        time.sleep(0.025)
    return {}


def _refused(exc: LeaseRefused) -> dict[str, Any]:
    return {"refused": str(exc), "path": exc.path, "agent_host": os.uname().nodename}


def take(directory: str, host: str, holder: dict[str, Any]) -> tuple[Lease | None, dict[str, Any]]:
    """Lease ``host``: (the lease, its record) if it was free, else (None, the current holder's record).

    A lease file that is unsafe to use gives (None, ``{"refused": message, "path": path}``): the agent
    says so in its hello like a busy host, and the controller fails at once naming the host and file.
    """
    path = lock_path(directory, host)
    try:
        fd, writable = _open(path)
    except LeaseRefused as exc:
        return None, _refused(exc)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            return None, _refused(LeaseRefused(path, f"cannot be locked: {exc.strerror or exc}"))
        current = read_holder(fd)
        os.close(fd)
        return None, current
    record = dict(holder)
    record.update(host=host, agent_pid=os.getpid(), agent_host=os.uname().nodename, since=now_iso())
    if writable:
        data = json.dumps(record, sort_keys=True).encode() + b"\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    return Lease(fd, path, record), record
