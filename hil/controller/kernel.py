"""The kernels of a run's hosts, and what their RDMA resource tracking showed: the report's ``"kernel"`` and
``"kernel_resources"`` (docs/downstream.md, docs/lab.md).

Each agent says in its hello which kernel its host runs and whether it reads the kernel's record of the
RDMA objects its processes hold (the verbs engine's witness, hil/agent/engines/verbs/witness.py). Its
readings come back in the end-of-test batch (``HilBackend.end_test``: no round trip of their own) and are
kept here per host and per test, compactly: how many readings, what each process held at the last reading
of each kind, and every finding in full. At the session's end one more reading per host, taken after the
agent closed its processes, shows what they left.

Plain dicts and lists, so an xdist worker can ship the record in ``workeroutput`` as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["KernelLog", "merge_records"]


class KernelLog:
    """Per host: its kernel, its witness, its readings per test and at the session's end."""

    def __init__(self) -> None:
        self.kernels: dict[str, str] = {}
        self.proxies: dict[str, dict[str, Any]] = {}  # the report's "proxy": which proxy driver ran on each host
        self.record: dict[str, dict[str, Any]] = {}  # the report's "kernel_resources", filled as it goes
        self._pending: dict[str, list[dict[str, Any]]] = {}

    def host(self, name: str, release: object, witness: object, workarounds: object = None,
             proxy: object = None) -> None:
        """What a host's (possibly restarted) agent said in its hello: its kernel, its witness, the kernel
        workarounds its engine applies there (hil/agent/engines/verbs/quirks.py), its proxy driver."""
        if isinstance(release, str):
            self.kernels[name] = release
        if isinstance(proxy, Mapping):
            self.proxies[name] = dict(proxy)
        entry = self.record.setdefault(name, {"tests": [], "session_end": None})
        if isinstance(workarounds, list):
            entry["workarounds"] = [str(w) for w in workarounds]
        if isinstance(witness, Mapping):
            entry.update({k: witness.get(k) for k in ("reader", "device", "cap_net_admin", "unavailable")})
        else:
            entry.setdefault("unavailable", "this host's engine does not read the kernel's RDMA resources")

    def add(self, name: str, readings: Iterable[dict[str, Any]]) -> None:
        """Readings a host's agent took (until the next ``take``)."""
        self._pending.setdefault(name, []).extend(readings)

    def take(self, nodeid: str) -> None:
        """File the pending readings of every host under the test ``nodeid``."""
        for name, readings in self._pending.items():
            if readings:
                self.record.setdefault(name, {"tests": [], "session_end": None})["tests"].append(
                    summarize(nodeid, readings))
        self._pending = {}

    def session_end(self, name: str, reading: dict[str, Any]) -> None:
        self.record.setdefault(name, {"tests": [], "session_end": None})["session_end"] = reading

    def findings(self) -> list[str]:
        """Every finding of the run, named by host and test (or the session's end)."""
        out = []
        for name, entry in self.record.items():
            for test in entry["tests"]:
                out += [f"{name}: {test['nodeid']}: {f['at']}: {f['finding']}" for f in test["findings"]]
            end = entry.get("session_end") or {}
            found = (*end.get("findings", ()), *end.get("pin_findings", ()))
            out += [f"{name}: at the session's end: {f}" for f in found]
        return out


def summarize(nodeid: str, readings: list[dict[str, Any]]) -> dict[str, Any]:
    """One test's readings: their number, what the processes held at the last one of each kind, every finding."""
    test: dict[str, Any] = {"nodeid": nodeid, "readings": sum(int(r.get("count", 1)) for r in readings),
                            "findings": []}
    for reading in readings:
        at = str(reading.get("at"))
        if at == "dropped":  # the agent kept only the last ones (and every one with a finding)
            continue
        test[at] = reading.get("processes", {}) if "unavailable" not in reading else {
            "unavailable": reading["unavailable"]}
        test["findings"] += [{"at": at, "finding": f} for f in reading.get("findings", ())]
        test["findings"] += [{"at": at, "finding": f, "rule": "R12"} for f in reading.get("pin_findings", ())]
        if reading.get("pinned_pages"):
            test.setdefault("pinned_pages", {})[at] = reading["pinned_pages"]
    return test


def merge_records(into: dict[str, dict[str, Any]], other: Mapping[str, Any]) -> None:
    """Another worker's record (xdist) into ``into``: its hosts' tests appended, the rest as it says."""
    for name, entry in other.items():
        mine = into.setdefault(name, {"tests": [], "session_end": None})
        for key, value in entry.items():
            if key == "tests":
                mine["tests"] += list(value)
            elif key != "session_end" or value is not None:
                mine[key] = value
