"""The kernel as an independent witness of what a verbs host's processes hold.

The leak check (R11, R12) otherwise trusts the engine's own books: ``registrations()``, ``leaks()``. The
kernel keeps a record of its own of every MR, QP, PD, CQ, CM id and context a process holds
(:mod:`hil.agent.rdma_netlink`). A *reading* lists those of the agent's processes and compares them with
what each process declares it holds:

* its MRs must be exactly what its provider reports as registered (``registrations(socket)`` of each open
  socket: one MR per registration) plus the engine's own MRs, which the engine names (each socket's
  null page); proxy pins are not MRs and are not counted;
* its QPs, PDs and CM ids must be those of its open sockets, its CQ and context its own, plus what the
  connection manager's library holds for it (librdmacm: a context once the process used the CM, a PD while
  any of its CM ids exists), which the process declares too.

Whatever the kernel holds beyond that is a finding, named as the kernel saw it (pid, MR number, length,
keys where the reader may see them); so is a declared object the kernel does not hold. After a test's
cleanup, when the test's sockets are closed, what is left is a leak (R11): it fails the test as the
books' leaks do. Memory windows are not tracked by the kernel, so they are not compared.

Standard library only, Python 3.9+.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from hil.agent.rdma_netlink import KernelUnreadable, cap_net_admin, read_resources

__all__ = ["COUNTED", "KernelWitness", "describe_mr", "judge"]

COUNTED = ("qp", "pd", "cq", "cm_id", "ctx")  # compared by number; MRs one by one
_NAMES = {"qp": "QP", "pd": "PD", "cq": "CQ", "cm_id": "CM id", "ctx": "verbs context", "mr": "MR"}
_IDS = {"qp": "lqpn", "pd": "pdn", "cq": "cqn", "cm_id": "cm_idn", "ctx": "ctxn", "mr": "mrn"}

Reader = Callable[[str], dict[str, list[dict[str, Any]]]]


def describe_mr(entry: dict[str, Any]) -> str:
    keys = "".join(f", {k} {entry[k]:#x}" for k in ("lkey", "rkey") if k in entry)
    return f"MR mrn {entry.get('mrn', '?')} of {entry.get('length', '?')} bytes{keys}"


def _who(process: dict[str, Any]) -> str:
    return f"pid {process['pid']} ({process.get('role', 'process')})"


def _expected_mrs(process: dict[str, Any]) -> list[dict[str, Any]]:
    """What the process says it holds as MRs: each reported registration, then the engine's own."""
    out = []
    for sock in process.get("sockets", ()):
        for reg in sock.get("registrations", ()):
            out.append({"length": reg.get("length"), "key": reg.get("key"), "kind": reg.get("kind"),
                        "what": f"{reg.get('kind')} registration {reg.get('key', 0):#x} of socket {sock['id']}"})
        for mr in sock.get("mrs", ()):
            out.append({"length": mr.get("length"), "key": mr.get("lkey"), "kind": "internal",
                        "what": f"{mr.get('what', 'internal MR')} of socket {sock['id']}"})
    return out


def _match_mrs(kernel: list[dict[str, Any]], expected: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                                      list[dict[str, Any]]]:
    """(kernel MRs nothing declared explains, declared MRs the kernel does not hold): by key where the
    kernel shows keys (a handle is an lkey, a descriptor without windows an rkey), then by length (a
    window's rkey is the window's, not its MR's; without CAP_NET_ADMIN there are no keys)."""
    left = list(kernel)
    missing = []
    by_length = []
    for want in expected:
        hit = next((k for k in left if want["key"] is not None and want["key"] in (k.get("lkey"), k.get("rkey"))
                    and k.get("length") == want["length"]), None)
        if hit is not None:
            left.remove(hit)
        else:
            by_length.append(want)
    for want in by_length:
        hit = next((k for k in left if k.get("length") == want["length"]), None)
        if hit is not None:
            left.remove(hit)
        else:
            missing.append(want)
    return left, missing


def judge(at: str, kernel: dict[str, list[dict[str, Any]]], processes: Sequence[dict[str, Any]],
          every: bool = False) -> dict[str, Any]:
    """A reading: per process what the kernel holds for it, and the findings (strings naming process and
    object) where that differs from what the process declares. ``at`` says when (during, after the test's
    cleanup, after the reset, at the session's end). A process with no sockets of its own (the agent, one
    that ended) is listed only when the kernel holds something of it, or ``every``."""
    findings: list[str] = []
    held: dict[str, Any] = {}
    for process in processes:
        pid = process["pid"]
        mine = {kind: [e for e in entries if e.get("tgid", e.get("pid")) == pid] for kind, entries in kernel.items()}
        if process.get("sockets") is not None or any(mine.values()) or every:
            held[str(pid)] = {"role": process.get("role", "process"),
                              "mr": [[e.get("mrn"), e.get("length")] for e in mine.get("mr", [])],
                              **{kind: len(mine.get(kind, [])) for kind in COUNTED}}
        extra, missing = _match_mrs(mine.get("mr", []), _expected_mrs(process))
        for entry in extra:
            findings.append(f"{_who(process)} holds {describe_mr(entry)} that its provider does not report")
        for expected in missing:
            findings.append(f"{_who(process)}: the kernel holds no MR of {expected['length']} bytes for its "
                            f"{expected['what']}")
        declared = _declared_counts(process)
        for kind in COUNTED:
            have, books = mine.get(kind, []), declared[kind]
            if len(have) > books:
                ids = ", ".join(str(e.get(_IDS[kind], "?")) for e in have)
                findings.append(f"{_who(process)} holds {len(have)} {_NAMES[kind]}(s) ({_IDS[kind]} {ids}), "
                                f"its books {books}")
            elif len(have) < books:
                findings.append(f"{_who(process)}: its books name {books} {_NAMES[kind]}(s), the kernel holds "
                                f"{len(have)}")
    reading: dict[str, Any] = {"at": at, "processes": held, "findings": findings}
    unowned = unowned_objects(kernel)
    if unowned:
        reading["unowned"] = unowned
    return reading


def unowned_objects(kernel: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    """[kind, id] of every user object the kernel names no thread for: its making thread has ended (a
    library's helper thread, say), so no reading by process can see it, though a live process holds it."""
    return [[kind, e.get(_IDS[kind])] for kind, entries in kernel.items() for e in entries
            if "pid" not in e and "kern_name" not in e]


def _declared_counts(process: dict[str, Any]) -> dict[str, int]:
    counts = {kind: int(process.get(kind, 0)) for kind in COUNTED}
    for sock in process.get("sockets", ()):
        for kind in ("qp", "pd", "cm_id"):
            counts[kind] += int(sock.get(kind, 0))
    return counts


KEPT = 100  # readings kept between two collections (the model reads after each of its sequences)


class KernelWitness:
    """Readings of the kernel's record for one device, kept until the controller collects them: at most
    ``KEPT``, the oldest without a finding dropped first (and counted)."""

    def __init__(self, device: str, read: Reader | None = None) -> None:
        self.device = device
        self._read: Reader = read or (lambda d: read_resources(d))
        self.keys = cap_net_admin()
        self.unavailable: str | None = None
        self._unowned_before: set[tuple[str, Any]] = set()  # there before the session: not its to judge
        try:
            self._unowned_before = {(kind, ident) for kind, ident in unowned_objects(self._read(device))}
        except KernelUnreadable as exc:
            self.unavailable = exc.strerror or str(exc)
        self.readings: list[dict[str, Any]] = []
        self.dropped = 0

    def describe(self) -> dict[str, Any]:
        """For the agent's hello: whether it reads, and whether it sees keys (CAP_NET_ADMIN)."""
        return {"reader": "netlink", "device": self.device, "cap_net_admin": self.keys, "pid": os.getpid(),
                "unavailable": self.unavailable}

    def read(self, at: str, processes: Sequence[dict[str, Any]], every: bool = False,
             pins: tuple[dict[str, int], list[str]] | None = None) -> dict[str, Any]:
        """Take a reading now, keep it, return it (``every``: list every process judged, see ``judge``); ``pins``:
        what the pin witness read at the same time (pin_witness.py): each process's pinned pages, its findings."""
        if self.unavailable is not None:
            reading: dict[str, Any] = {"at": at, "unavailable": self.unavailable, "processes": {}, "findings": []}
        else:
            try:
                reading = judge(at, self._read(self.device), processes, every)
                self._judge_unowned(reading, every)
            except KernelUnreadable as exc:
                reading = {"at": at, "unavailable": exc.strerror or str(exc), "processes": {}, "findings": []}
        if pins is not None:
            reading["pinned_pages"], reading["pin_findings"] = pins
        self.readings.append(reading)
        if len(self.readings) > KEPT:
            quiet = next((r for r in self.readings if not r["findings"] and not r.get("pin_findings")), None)
            if quiet is not None:
                self.readings.remove(quiet)
                self.dropped += 1
        return reading

    def _judge_unowned(self, reading: dict[str, Any], every: bool) -> None:
        """At the session's end (``every``), an object no thread owns that appeared during the session is a
        finding: this device is leased to the session, so a live process of it holds the object."""
        now = {(kind, ident) for kind, ident in reading.get("unowned", ())}
        if every:
            for kind, ident in sorted(now - self._unowned_before, key=str):
                reading["findings"].append(f"the kernel holds {_NAMES[kind]} {_IDS[kind]} {ident}, made during the "
                                           f"session by a thread that has ended (no pid): nothing released it")

    def unreported(self) -> list[dict[str, Any]]:
        """The readings whose findings nobody was told yet; they count as told from now on."""
        new = [r for r in self.readings if not r.get("reported")]
        for reading in new:
            reading["reported"] = True
        return new

    def take(self) -> list[dict[str, Any]]:
        """The readings since the last take (with one saying how many were dropped, if any)."""
        readings, self.readings = self.readings, []
        for reading in readings:
            reading.pop("reported", None)
        if self.dropped:
            readings.insert(0, {"at": "dropped", "count": self.dropped, "processes": {}, "findings": []})
            self.dropped = 0
        return readings
