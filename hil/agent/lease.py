"""The agent's lease on its host: a name in Linux's abstract socket namespace, held for the agent's life.
Python 3.9+, standard library.

At start the agent binds and listens on the abstract UNIX socket ``pytest-san-lease/<scope>/<host>``
(``<host>`` the inventory host name, ``<scope>`` a digest of the directory the agent was pushed to,
``san_remote_tmp`` or ``/tmp``) and keeps it until it exits. Binding a name that a live socket holds fails,
and the kernel frees the name with the socket's last descriptor, so a dead agent, controller or SSH
connection frees the host at once: there is no stale lock to clean by hand.

A host's NIC is one, whoever uses it: the name is the same for every user of the host, so leases exclude
across users. Being no file, a lease cannot be planted (a name is held only by a live process), broken or
stolen (only its holder can close its socket) by another user, and any user can take a free one. The
namespace is the network namespace's: agents in different network namespaces (containers with a network
of their own) do not see each other's leases.

Whoever finds the name taken connects to it: the holder's thread answers with its record (controller, pid,
worker, run, user, since) and closes; the kernel's word on who listens (``SO_PEERCRED``: pid and uid) is
the record when the holder does not answer in time. The socket is close-on-exec and the agent never forks
without exec, so no child keeps the lease.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pwd
import re
import socket
import struct
import threading
import time
from datetime import datetime, timezone
from typing import Any

PREFIX = "pytest-san-lease/"
_ANSWER_TIMEOUT = 2.0  # seconds a holder gets to answer who it is
_TRIES = 50  # x 20 ms: a name being bound or released, or a holder not listening yet
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def now_iso() -> str:
    """Local time with its UTC offset, to the millisecond (what lease records carry)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def lease_name(scope: str, host: str) -> str:
    """The abstract socket name of inventory host ``host`` in ``scope`` (the agents' directory): readable
    in ``ss -xl`` (the host's name, cut to what the namespace allows), unique by digest."""
    digest = hashlib.sha256(f"{os.path.normpath(scope)}\0{host}".encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:60] or "_"
    return f"{PREFIX}{digest}/{safe}"


def _address(name: str) -> bytes:
    return b"\0" + name.encode()


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Lease:
    """A held lease: the listening socket, and the record it answers with."""

    def __init__(self, sock: socket.socket, name: str, holder: dict[str, Any]) -> None:
        self.sock = sock
        self.name = name
        self.holder = holder
        self._answer = json.dumps(holder, sort_keys=True).encode() + b"\n"
        self._thread = threading.Thread(target=self._serve, name="lease", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # released
                return
            with conn:
                try:
                    conn.settimeout(_ANSWER_TIMEOUT)
                    conn.sendall(self._answer)
                except OSError:
                    pass  # the asker went away: its loss

    def release(self) -> None:
        """Give the name back now (the kernel does the same when the agent dies)."""
        if self.sock.fileno() >= 0:
            # accept() in the serving thread holds the socket; shutdown wakes it, so close frees the name
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        self._thread.join(_ANSWER_TIMEOUT)


def read_holder(name: str) -> dict[str, Any] | None:
    """The record of whoever holds lease ``name``; None if no one listens on it (it is free, or about to be)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(_ANSWER_TIMEOUT)
        try:
            conn.connect(_address(name))
        except OSError:
            return None
        try:
            pid, uid, _ = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            known: dict[str, Any] = {"agent_pid": pid, "uid": uid, "user": _user(uid)}
        except OSError:
            known = {}
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    return {**known, **record} if isinstance(record, dict) else known


def take(directory: str, host: str, holder: dict[str, Any]) -> tuple[Lease | None, dict[str, Any]]:
    """Lease ``host`` in ``directory``'s scope: (the lease, its record) if it was free, else (None, the
    current holder's record).

    A lease that cannot be taken at all (no UNIX sockets here) gives (None, ``{"refused": message}``): the
    agent says so in its hello like a busy host, and the controller fails at once naming the host.
    """
    name = lease_name(directory, host)
    record = dict(holder)
    uid = os.geteuid()
    record.update(host=host, agent_pid=os.getpid(), agent_host=os.uname().nodename, uid=uid, user=_user(uid))
    for _ in range(_TRIES):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(_address(name))
            sock.listen(16)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                return None, {"refused": f"lease {name!r} of host {host} cannot be taken: {exc.strerror or exc}",
                              "agent_host": os.uname().nodename}
            current = read_holder(name)
            if current is not None:
                return None, current
            time.sleep(0.02)  # bound but not listening yet, or closing: ask again
            continue
        record["since"] = now_iso()
        return Lease(sock, name, record), record
    return None, {"refused": f"lease {name!r} of host {host} is taken and given back over and over",
                  "agent_host": os.uname().nodename}
