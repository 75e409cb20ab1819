"""The kernel's own record of RDMA resources, read over netlink (what ``rdma resource show`` prints).

Every MR, QP, PD, CQ, CM id and verbs context a process holds is tracked by the kernel (rdma restrack) and
listed by the RDMA netlink family's ``RDMA_NLDEV_CMD_RES_*_GET`` dumps, per device, with the pid that made
it. This reads them with the standard library alone (``socket.AF_NETLINK``, ``NETLINK_RDMA``): no
iproute2 (whose ``rdma -j`` output changed between releases) and no process started per reading, which
costs tens of milliseconds a time in a TCG guest. Memory windows are not tracked by the kernel at all.

Permissions (kernel 6.1 and 6.12, drivers/infiniband/core/nldev.c): the dumps need no privilege, and
every process's objects are listed to any user; only with CAP_NET_ADMIN does an MR entry carry its lkey
and rkey and a PD its local_dma_lkey. Without it the lengths, numbers (mrn, pdn, lqpn, cqn) and pids are
still there. A kernel without RDMA netlink (no InfiniBand core) refuses the socket: ``KernelUnreadable``.

Standard library only, Python 3.9+: it runs on lab hosts with the agent.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["KINDS", "KernelUnreadable", "cap_net_admin", "parse_dump", "read_resources", "thread_group"]

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
CMD_GET = 1  # RDMA_NLDEV_CMD_GET: the devices
ATTR_DEV_INDEX, ATTR_DEV_NAME = 1, 2
CAP_NET_ADMIN = 12

_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr: len, type, flags, seq, pid
_ATTR = struct.Struct("=HH")  # struct nlattr: len, type

Decode = Callable[[bytes], Any]


def _u8(b: bytes) -> int:
    return b[0]


def _u32(b: bytes) -> int:
    return int(struct.unpack_from("=I", b)[0])


def _u64(b: bytes) -> int:
    return int(struct.unpack_from("=Q", b)[0])


def _str(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


# Attributes every entry may carry (include/uapi/rdma/rdma_netlink.h); and per kind: (dump command, table
# attribute, entry attribute, its own fields).
_COMMON: dict[int, tuple[str, Decode]] = {3: ("port", _u32), 28: ("pid", _u32), 29: ("kern_name", _str)}
KINDS: dict[str, tuple[int, int, int, dict[int, tuple[str, Decode]]]] = {
    "qp": (10, 19, 20, {21: ("lqpn", _u32), 22: ("rqpn", _u32), 26: ("type", _u8), 27: ("state", _u8),
                        60: ("pdn", _u32)}),
    "cm_id": (11, 30, 31, {26: ("type", _u8), 27: ("state", _u8), 32: ("ps", _u32), 21: ("lqpn", _u32),
                           63: ("cm_idn", _u32)}),
    "cq": (12, 35, 36, {37: ("cqe", _u32), 38: ("users", _u64), 61: ("cqn", _u32), 64: ("ctxn", _u32)}),
    "mr": (13, 40, 41, {42: ("rkey", _u32), 43: ("lkey", _u32), 44: ("iova", _u64), 45: ("length", _u64),
                        62: ("mrn", _u32), 60: ("pdn", _u32)}),
    "pd": (14, 46, 47, {48: ("local_dma_lkey", _u32), 49: ("unsafe_global_rkey", _u32), 38: ("users", _u64),
                        60: ("pdn", _u32), 64: ("ctxn", _u32)}),
    "ctx": (22, 86, 87, {64: ("ctxn", _u32)}),
}


class KernelUnreadable(OSError):
    """The kernel's RDMA resource tracking cannot be read here (no RDMA netlink, or it refused)."""


def _attrs(data: bytes, offset: int = 0, end: int | None = None) -> list[tuple[int, bytes]]:
    """(type, payload) of each netlink attribute in ``data[offset:end]``."""
    out = []
    end = len(data) if end is None else end
    while offset + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size or offset + length > end:
            break  # malformed: stop rather than read another attribute's bytes
        out.append((kind & NLA_TYPE_MASK, data[offset + _ATTR.size:offset + length]))
        offset += (length + 3) & ~3
    return out


def _entry(payload: bytes, fields: dict[int, tuple[str, Decode]]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for kind, value in _attrs(payload):
        named = fields.get(kind) or _COMMON.get(kind)
        if named is not None and value:
            entry[named[0]] = named[1](value)
    return entry


def parse_dump(kind: str, messages: list[bytes]) -> list[dict[str, Any]]:
    """The entries of a ``kind`` dump, from its messages' attribute payloads (after each nlmsghdr); each
    entry also names its device."""
    _, table, entry_type, fields = KINDS[kind]
    entries = []
    for payload in messages:
        device = None
        for attr, value in _attrs(payload):
            if attr == ATTR_DEV_NAME:
                device = _str(value)
            elif attr == table:
                for inner, entry in _attrs(value):
                    if inner == entry_type:
                        entries.append({"device": device, **_entry(entry, fields)})
    return entries


class _Netlink:
    """One NETLINK_RDMA socket, for dumps."""

    _seq = itertools.count(1)

    def __init__(self, timeout: float) -> None:
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
        except (OSError, AttributeError) as exc:  # AttributeError: no AF_NETLINK (not Linux)
            why = f"this kernel has no RDMA netlink (socket(AF_NETLINK, NETLINK_RDMA): {exc})"
            raise KernelUnreadable(errno.EPROTONOSUPPORT, why) from None
        self.sock.settimeout(timeout)
        self.sock.bind((0, 0))

    def close(self) -> None:
        self.sock.close()

    def dump(self, command: int, attrs: bytes = b"") -> list[bytes]:
        """The payloads of every message a dump of ``command`` answers with."""
        seq = next(self._seq)
        kind = (RDMA_NL_NLDEV << 10) + command
        self.sock.send(_HEADER.pack(_HEADER.size + len(attrs), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + attrs)
        payloads: list[bytes] = []
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:  # Python 3.9: not yet TimeoutError
                raise KernelUnreadable(errno.ETIMEDOUT, f"RDMA netlink did not answer command {command}") from None
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, mtype, _flags, mseq, _pid = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    raise KernelUnreadable(errno.EPROTO, f"a malformed netlink message (length {length})")
                body = data[offset + _HEADER.size:offset + length]
                offset += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_DONE:
                    return payloads
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body)[0] if len(body) >= 4 else errno.EPROTO
                    if code == 0:
                        continue
                    raise KernelUnreadable(code, f"RDMA netlink refused command {command}: {os.strerror(code)}")
                if mtype == kind:
                    payloads.append(body)


def _u32_attr(kind: int, value: int) -> bytes:
    return _ATTR.pack(_ATTR.size + 4, kind) + struct.pack("=I", value)


def read_resources(device: str | None = None, kinds: tuple[str, ...] = tuple(KINDS),
                   timeout: float = 5.0) -> dict[str, list[dict[str, Any]]]:
    """{kind: [entry, ...]} of every RDMA device (or only ``device``): what ``rdma resource show <kind>``
    lists. An entry has its device, its pid (the user thread that made it) and tgid (that thread's process),
    or kern_name (the kernel's), or neither (a user object whose thread has ended), and the fields of
    ``KINDS`` the kernel filled in."""
    link = _Netlink(timeout)
    try:
        devices = []
        for payload in link.dump(CMD_GET):
            attrs = dict(_attrs(payload))
            if ATTR_DEV_INDEX in attrs and ATTR_DEV_NAME in attrs:
                devices.append((_u32(attrs[ATTR_DEV_INDEX]), _str(attrs[ATTR_DEV_NAME])))
        found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
        for index, name in devices:
            if device is not None and name != device:
                continue
            for kind in kinds:
                with contextlib.suppress(KernelUnreadable):  # a kind this kernel does not dump (ctx before 5.x)
                    found[kind] += parse_dump(kind, link.dump(KINDS[kind][0], _u32_attr(ATTR_DEV_INDEX, index)))
        _owners(found)
        return found
    finally:
        link.close()


def thread_group(pid: int) -> int:
    """The process (thread group) of the task ``pid``: the kernel tags an object with the *thread* that made
    it (``task_pid_vnr``), so an MR a process registered from a second thread carries that thread's id. A
    task that is gone (or unreadable) is its own group."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pid


def _owners(found: dict[str, list[dict[str, Any]]]) -> None:
    """Name each user object's process (``tgid``) beside the thread the kernel tags it with (``pid``). An
    object whose making thread has ended has no pid at all (the process may still hold it)."""
    groups: dict[int, int] = {}
    for entries in found.values():
        for entry in entries:
            if "pid" in entry:
                pid = entry["pid"]
                if pid not in groups:
                    groups[pid] = thread_group(pid)
                entry["tgid"] = groups[pid]


def cap_net_admin() -> bool:
    """Whether this process may see keys (lkey, rkey) in the kernel's listing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return False
