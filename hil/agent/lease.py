"""The agent's lease on what it drives: a name in Linux's abstract socket namespace, held for the agent's life.
Python 3.9+, standard library.

At start the agent binds and listens on an abstract UNIX socket and keeps it until it exits. Binding a name
that a live socket holds fails, and the kernel frees the name with the socket's last descriptor, so a dead
agent, controller or SSH connection frees the lease at once: there is no stale lock to clean by hand.

The name is that of what the agent holds on this machine, never the inventory's name for the machine, so
two inventories (or users) that name one machine differently still exclude each other:

* a ``verbs`` agent leases the RDMA device's port: ``pytest-san-lease/verbs/<device>/<port>`` (``san_device``
  and ``san_port``, else what the engine will pick: the first device, and port, that is ACTIVE). Two agents on
  one port exclude each other, whoever started them, whatever ``san_remote_tmp`` they use; two devices, or
  two ports of one device, are two leases.
* an ``emulator`` agent holds nothing of its machine (its SAN is in the agent's process), so its lease is
  its inventory host's, in its ``san_remote_tmp``'s scope: ``pytest-san-lease/<digest>/<host>``. That is
  what lets one machine serve several emulator hosts (the project's own tests run two over one sshd).

The abstract namespace is the kernel's (per network namespace), so the machine is implicit in the name:
agents in other network namespaces (containers with a network of their own) do not see these leases.

Whoever finds the name taken connects to it. Who holds it is the kernel's word: ``SO_PEERCRED`` gives the
listener's pid and uid, ``/proc/<pid>/status`` and ``/proc/<pid>/cmdline`` its user and command line. The
holder then answers with its record (worker, run, controller, pid, since): that is only the holder's claim,
so it is kept only when the command line is an agent's, only its known keys, each cut to a short token of
plain characters; the kernel's facts always win. A process that is no agent is shown as what it is (uid,
user, pid, command line), never with what it says. Reading the answer has a total deadline and a size cap,
so a holder that trickles bytes costs at most ``_ANSWER_TIMEOUT`` seconds; one that accepts no connection, or
never listens, is looked for by its socket's inode among the processes this user may see.

What another local user can and cannot do: any user takes a free lease; no user can break or steal another's
(only its holder can close its socket, and a second bind of a held name fails) or plant one (a name is held
only by a live process, and nothing on disk stands for a lease). A user *can* hold the lease, with any
process, for as long as that process lives: that is what a lease is for (the holder has the NIC), and such a
holder is shown by its uid, pid and command line. The socket is close-on-exec and the agent never forks
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
_ANSWER_TIMEOUT = 2.0  # seconds, in all, that a holder gets to accept and answer who it is
_ANSWER_LIMIT = 4096  # bytes of a holder's answer that are read at most
_TRIES = 50  # x 20 ms: a name being bound or released, or a holder not listening yet
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# What a holder may claim about itself, and what each claim may hold: a short token (worker and run ids,
# host names, ISO times), so a claim can never read as the kernel's facts or as a sentence.
CLAIMS = ("worker", "run", "controller", "pid", "since", "host", "agent_host")
_TOKEN = re.compile(r"[A-Za-z0-9._:+@-]{1,64}")
_AGENT = re.compile(r"(^|/)hil/agent/__main__\.py$")
_COMMAND_LIMIT = 300  # characters of a holder's command line that are shown


def now_iso() -> str:
    """Local time with its UTC offset, to the millisecond (what lease records carry)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def _safe(text: str, limit: int = 60) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:limit] or "_"


def lease_name(scope: str, host: str, engine: str = "emulator", device: str | None = None,
               port: int | None = None) -> str:
    """The abstract socket name of an agent's lease (readable in ``ss -xl``, cut to what the namespace allows).

    ``verbs``: the RDMA ``device`` and ``port`` alone (the machine's NIC port, whatever the inventory calls the
    machine, wherever the agent was pushed); ``emulator``: inventory host ``host`` in ``scope`` (the agents'
    directory), unique by digest."""
    if engine == "verbs":
        return f"{PREFIX}verbs/{_safe(device or '?')}/{port if port is not None else '?'}"
    digest = hashlib.sha256(f"{os.path.normpath(scope)}\0{host}".encode()).hexdigest()[:16]
    return f"{PREFIX}{digest}/{_safe(host)}"


def verbs_port(device: str | None, port: int | None) -> tuple[str | None, int | None]:
    """The device and port a verbs agent leases: ``san_device`` and ``san_port``, what the engine will pick for
    either that is unset (the first device, and port, that is ACTIVE), or as given when there is none (the
    engine then says why it cannot start, after the lease)."""
    if device and port is not None:
        return device, port
    try:
        from hil.agent.engines.verbs.devices import NoRdmaDevice, select_device

        return select_device(device or None, port=port)
    except (ImportError, OSError, NoRdmaDevice):
        return device, port


def _address(name: str) -> bytes:
    return b"\0" + name.encode()


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _read_proc(pid: int, what: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read(65536)
    except OSError:
        return None


def process_facts(pid: int, uid: int) -> dict[str, Any]:
    """What the kernel says of process ``pid`` (a lease's listener, by ``SO_PEERCRED``): its uid and user,
    its command line (``command``, cut; "" when /proc hides it) and whether that is an agent's (``agent``)."""
    facts: dict[str, Any] = {"agent_pid": pid, "uid": uid, "user": _user(uid), "command": "", "agent": False}
    if pid <= 0:  # the listener is in a PID namespace this process cannot see
        facts["command"] = "(a process of another PID namespace)"
        return facts
    status = _read_proc(pid, "status")
    cmdline = _read_proc(pid, "cmdline")
    if status is None:  # gone, or /proc mounted with hidepid
        facts["command"] = "(gone, or hidden by /proc)"
        return facts
    found = re.search(rb"^Uid:\s+(\d+)", status, re.M)
    if found is None or int(found.group(1)) != uid:  # the pid was reused: a process that holds nothing
        facts["command"] = "(gone: its pid is now another process's)"
        return facts
    args = [a.decode(errors="replace") for a in (cmdline or b"").split(b"\0") if a]
    if not args:
        name = re.search(rb"^Name:\s*(.*)$", status, re.M)
        args = [f"[{name.group(1).decode(errors='replace')}]" if name else "?"]
    text = " ".join(args)
    text = "".join(c if c.isprintable() else "?" for c in text)
    facts["command"] = text if len(text) <= _COMMAND_LIMIT else text[:_COMMAND_LIMIT] + "..."
    facts["agent"] = any(_AGENT.search(a) for a in args[:4])  # python3 [an option or two] __main__.py
    return facts


def find_holder(name: str, deadline: float) -> dict[str, Any]:
    """The kernel's facts on whoever holds lease ``name`` when it cannot be asked (it accepts no connection,
    or never listens): its socket's inode from ``/proc/net/unix``, then the process with that socket among
    those whose descriptors this user may read (all, as root). {} when it cannot be found before ``deadline``."""
    wanted = "@" + name
    links = set()
    try:
        with open("/proc/net/unix") as table:
            for line in table:
                fields = line.split()
                # the bound socket itself, not the connections queued on it (state 03, connected)
                if len(fields) >= 8 and fields[7] == wanted and fields[5] == "01":
                    links.add(f"socket:[{fields[6]}]")
    except OSError:
        return {}
    if not links:
        return {}
    for entry in os.listdir("/proc"):
        if time.monotonic() > deadline:
            break
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") not in links:
                    continue
                uid = os.stat(f"/proc/{entry}").st_uid
            except OSError:
                continue
            return process_facts(int(entry), uid)
    return {}


def claims(answer: object) -> dict[str, Any]:
    """The keys of ``CLAIMS`` in a holder's answer whose values are short plain tokens (pid: a number)."""
    if not isinstance(answer, dict):
        return {}
    kept: dict[str, Any] = {}
    for key in CLAIMS:
        value = answer.get(key)
        if key == "pid":
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 22:
                kept[key] = value
        elif isinstance(value, str) and _TOKEN.fullmatch(value):
            kept[key] = value
    return kept


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


def _answer(conn: socket.socket, deadline: float) -> tuple[bytes, str]:
    """Up to a line of at most ``_ANSWER_LIMIT`` bytes, read before ``deadline``: (the bytes, what went wrong)."""
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            return data, f"it did not say who it is within {_ANSWER_TIMEOUT:g} s"
        conn.settimeout(left)
        try:
            chunk = conn.recv(_ANSWER_LIMIT + 1 - len(data))
        except socket.timeout:  # Python 3.9: not yet TimeoutError
            return data, f"it did not say who it is within {_ANSWER_TIMEOUT:g} s"
        except OSError as exc:
            return data, f"reading its answer failed: {exc.strerror or exc}"
        if not chunk:
            return data, "" if data else "it closed without saying who it is"
        data += chunk
        if len(data) > _ANSWER_LIMIT:
            return b"", f"its answer is longer than {_ANSWER_LIMIT} bytes"
    return data, ""


def read_holder(name: str) -> dict[str, Any] | None:
    """Who holds lease ``name`` (the kernel's facts, and the holder's claims if it is an agent); None if no
    one listens on it (it is free, or about to be). Takes at most ``_ANSWER_TIMEOUT`` seconds in all."""
    deadline = time.monotonic() + _ANSWER_TIMEOUT
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(_ANSWER_TIMEOUT)
        try:
            conn.connect(_address(name))
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # bound but not listening (being taken or given back), or gone
        except OSError as exc:  # its queue is full: it never accepts
            found = find_holder(name, deadline)
            return {**found, "unanswered": f"it accepts no connection ({exc.strerror or 'timed out'})"
                    + ("" if found else f"; as root, `ss -xlp | grep {name}` names it")}
        try:
            pid, uid, _ = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        except OSError:
            pid, uid = 0, -1
        facts = process_facts(pid, uid) if uid >= 0 else {}
        data, trouble = _answer(conn, deadline)
    if trouble:
        facts["unanswered"] = trouble
    if facts.get("agent"):
        try:
            facts = {**claims(json.loads(data)), **facts}
        except ValueError:
            facts.setdefault("unanswered", "its answer is no JSON")
    return facts


def take(directory: str, host: str, holder: dict[str, Any], engine: str = "emulator",
         device: str | None = None, port: int | None = None) -> tuple[Lease | None, dict[str, Any]]:
    """Lease what an agent for inventory host ``host`` drives (see :func:`lease_name`): (the lease, its record)
    if it was free, else (None, the current holder's record, :func:`read_holder`'s).

    A lease that cannot be taken at all (no UNIX sockets here) gives (None, ``{"refused": message}``): the
    agent says so in its hello, and the controller fails at once naming the host. Only this agent's own
    failure is ever a refusal; nothing a holder answers is.
    """
    if engine == "verbs":
        device, port = verbs_port(device, port)
    name = lease_name(directory, host, engine, device, port)
    record = claims(holder)
    uid = os.geteuid()
    record.update(host=host, agent_pid=os.getpid(), agent_host=os.uname().nodename, uid=uid, user=_user(uid),
                  agent=True, lease=name)
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
                current["lease"] = name
                return None, current
            time.sleep(0.02)  # bound but not listening yet, or closing: ask again
            continue
        record["since"] = now_iso()
        return Lease(sock, name, record), record
    # Bound all along, never listening: a process holds the name without answering for it.
    found = find_holder(name, time.monotonic() + _ANSWER_TIMEOUT)
    return None, {**found, "lease": name, "unanswered": "it bound the name but does not listen on it"
                  + ("" if found else f"; as root, `ss -xap | grep {name}` names it")}
