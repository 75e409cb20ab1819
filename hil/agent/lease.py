"""The agent's lease on its host: an flock the agent holds for its whole life. Python 3.9+, standard library.

At start the agent locks ``<remote tmp>/pytest-san-lease-<inventory host name>.lock`` with
``flock(LOCK_EX | LOCK_NB)`` and keeps the descriptor open until it exits. The kernel drops the lock
with the last descriptor, so a dead agent, controller or SSH connection frees the host at once:
there is no stale lock to clean by hand. The holder (controller, pid, worker, run, since) is written
into the file for whoever finds the host busy; the lock, not the text, is what counts.

The descriptor is close-on-exec and the agent never forks without exec, so no child keeps the lock.
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


def _open(path: str) -> tuple[int, bool]:
    """(descriptor, writable). Never follows a symlink; creates the file shared (0666) if missing."""
    base = os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(10):
        try:
            fd = os.open(path, base | os.O_RDWR)
            writable = True
        except FileNotFoundError:
            try:
                fd = os.open(path, base | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue  # someone created it between our two opens
            os.fchmod(fd, 0o666)  # every user of the host shares the lease (umask aside)
            writable = True
        except PermissionError:
            # Another user's file (and fs.protected_regular forbids O_CREAT on it): flock works read-only.
            fd = os.open(path, base | os.O_RDONLY)
            writable = False
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"lease file {path} is not a regular file: remove it")
        return fd, writable
    raise OSError(errno.EAGAIN, f"lease file {path} keeps appearing and disappearing")


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


def take(directory: str, host: str, holder: dict[str, Any]) -> tuple[Lease | None, dict[str, Any]]:
    """Lease ``host``: (the lease, its record) if it was free, else (None, the current holder's record)."""
    path = lock_path(directory, host)
    fd, writable = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
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
