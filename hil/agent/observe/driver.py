"""The agent's side of a process under observation: a child program (``PROGRAMS``: rsockets' ``child.py``, the
NVMe-oF ``fabric.py`` and ``nvme_rogue.py``), its calls bounded in time, and the kernel's record of what it holds.

Each call waits at most its deadline. A call that does not return by then is a *hang*: the driver measures
what the process does meanwhile (its CPU share over a second, its state), reads what the kernel holds for it
while it hangs, kills it, and answers with all of that and the call's name, so a switch that hangs fails a
scenario within a bounded time instead of stopping the run. A call that fails answers its errno.

The kernel's record is read by thread group: rsockets' listen thread makes an accepted socket's QP, CQ and MRs,
so they carry that thread's id (``hil.agent.rdma_netlink`` names its process, ``tgid``); an object whose making
thread has ended carries no pid at all, and is listed apart (``unowned``) when it appeared after the child
started (the device is leased to the session: nothing else on it makes objects from a thread that ends).

A program that drives a kernel module (NVMe-oF's host and target) holds nothing itself: what it made is owned by
modules, which the kernel's record names (``kern_name``: ``nvme_rdma``, ``nvmet_rdma``, ``rdma_cm``). Such a
child is read by module (``modules``): the kernel-owned objects made since it started, each with its module.

Standard library only, Python 3.9+.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from hil.agent.rdma_netlink import KernelUnreadable, read_resources

_AGENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(_AGENT, "rsockets", "child.py")
PROGRAMS = {"rsockets": CHILD, "nvme": os.path.join(_AGENT, "nvme", "fabric.py"),
            "nvme-rogue": os.path.join(_AGENT, "engines", "verbs", "nvme_rogue.py")}
"""The programs a child can run, by the name ``spawn_observed`` takes."""
CLEANUP_DEADLINE = 120.0  # seconds a program's own cleanup may take after it was killed (NVMe-oF teardown)
KINDS = ("mr", "qp", "pd", "cq", "cm_id", "ctx")
_IDS = {"qp": "lqpn", "pd": "pdn", "cq": "cqn", "cm_id": "cm_idn", "ctx": "ctxn", "mr": "mrn"}
MR_FIELDS = ("mrn", "length", "lkey", "rkey", "pdn", "iova")

Reader = Callable[[], dict[str, list[dict[str, Any]]]]


def rsockets_library() -> str | None:
    """librdmacm's name where it exports the rsocket calls the child uses (else None): loaded to look, as the
    child loads it."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("rdmacm") or "librdmacm.so.1"
    try:
        lib = ctypes.CDLL(name)
        for call in ("rsocket", "rbind", "rlisten", "raccept", "rconnect", "riomap", "riounmap", "riowrite", "rclose"):
            getattr(lib, call)
    except (OSError, AttributeError):
        return None
    return name


class NotStarted(RuntimeError):
    """The child could not start (no librdmacm with rsockets, ...): the message says why."""


def _ticks(pid: int) -> int | None:
    """utime + stime of every thread of ``pid``, in clock ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def held_by(kernel: dict[str, list[dict[str, Any]]], pid: int, unowned_before: set[tuple[str, Any]]) -> dict[str, Any]:
    """What the kernel holds for process ``pid`` (by thread group), and objects no thread owns that were not
    there before (``unowned_before``): {"mr": [{mrn, length, lkey, rkey, pdn}], "qp": [...], ..., "unowned": {...}}."""
    out: dict[str, Any] = {}
    unowned: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        entries = kernel.get(kind, [])
        mine = [e for e in entries if e.get("tgid", e.get("pid")) == pid]
        orphans = [e for e in entries if "pid" not in e and "kern_name" not in e
                   and (kind, e.get(_IDS[kind])) not in unowned_before]
        out[kind] = [_fields(kind, e) for e in mine]
        if orphans:
            unowned[kind] = [_fields(kind, e) for e in orphans]
    out["unowned"] = unowned
    return out


def _fields(kind: str, entry: dict[str, Any]) -> dict[str, Any]:
    keep = MR_FIELDS if kind == "mr" else (_IDS[kind], "pdn", "state", "lqpn")
    return {k: entry[k] for k in keep if k in entry}


def run_cleanup(cmd: list[str], deadline: float = CLEANUP_DEADLINE) -> dict[str, Any]:
    """Run a killed program's cleanup command within ``deadline``: {"code", "said"} or {"hang": deadline}."""
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=deadline, check=False)
    except subprocess.TimeoutExpired:
        return {"hang": deadline, "command": " ".join(cmd)}
    except OSError as exc:
        return {"code": None, "said": str(exc)}
    return {"code": done.returncode, "said": (done.stdout + done.stderr).decode(errors="replace")[-2000:].strip()}


def kernel_owned(kernel: dict[str, list[dict[str, Any]]]) -> set[tuple[str, Any]]:
    """(kind, id) of every object a module owns."""
    return {(kind, e.get(_IDS[kind])) for kind in KINDS for e in kernel.get(kind, []) if "kern_name" in e}


def held_by_modules(kernel: dict[str, list[dict[str, Any]]], modules: tuple[str, ...],
                    before: set[tuple[str, Any]]) -> dict[str, Any]:
    """The kernel-owned objects of ``modules`` that were not there before (``before``), each with its
    ``module``; for a PD, its ``unsafe_global_rkey`` where it has one: {"mr": [...], ..., "modules": {name: count}}."""
    out: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for kind in KINDS:
        mine = [e for e in kernel.get(kind, []) if e.get("kern_name") in modules
                and (kind, e.get(_IDS[kind])) not in before]
        out[kind] = []
        for entry in mine:
            fields = _fields(kind, entry)
            fields["module"] = entry["kern_name"]
            if kind == "pd" and entry.get("unsafe_global_rkey"):
                fields["unsafe_global_rkey"] = entry["unsafe_global_rkey"]
            if kind == "pd" and "users" in entry:
                fields["users"] = entry["users"]
            out[kind].append(fields)
            counts[entry["kern_name"]] = counts.get(entry["kern_name"], 0) + 1
    out["modules"] = counts
    out["unowned"] = {}
    return out


def unowned_now(kernel: dict[str, list[dict[str, Any]]]) -> set[tuple[str, Any]]:
    return {(kind, e.get(_IDS[kind])) for kind in KINDS for e in kernel.get(kind, [])
            if "pid" not in e and "kern_name" not in e}


class ObservedChild:
    """One child program and its requests (one at a time, except those started in the background).

    ``program`` names what it runs (``PROGRAMS``); ``modules``: read the kernel's record by those modules'
    names instead of by the child's pid; ``cleanup``: a command run (bounded) once the child was killed, which
    undoes what a killed program could not (an NVMe-oF connection, a configfs target)."""

    _ids = itertools.count(1)

    def __init__(self, device: str | None, address: str | None = None, python: str | None = None,
                 start_timeout: float = 60.0, read: Reader | None = None, argv: list[str] | None = None,
                 program: str = "rsockets", modules: tuple[str, ...] = (),
                 cleanup: list[str] | None = None, extra: list[str] | None = None) -> None:
        """``argv``: the command to run instead of the program's (tests of the plumbing only); ``extra``: more
        arguments for the program."""
        if program not in PROGRAMS:
            raise ValueError(f"no program {program!r} to observe (there is: {', '.join(sorted(PROGRAMS))})")
        self.device = device
        self.program = program
        self.modules = modules
        self._cleanup = cleanup
        self.cleaned: dict[str, Any] | None = None  # what the cleanup command said, once it ran
        self._read: Reader = read or (lambda: read_resources(device))
        self._before: set[tuple[str, Any]] = set()
        self.kernel_unavailable: str | None = None
        try:
            reading = self._read()
            self._before = kernel_owned(reading) if modules else unowned_now(reading)
        except KernelUnreadable as exc:
            self.kernel_unavailable = exc.strerror or str(exc)
        cmd = argv or [python or sys.executable, PROGRAMS[program], *(["--address", address] if address else []),
                       *(["--device", device] if device and program != "rsockets" else []), *(extra or [])]
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the child
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      close_fds=True)
        self.pid = self._proc.pid
        self._replies: dict[Any, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        self._eof = False
        self._lock = threading.Lock()
        self.hang: dict[str, Any] | None = None  # the call that hung, once one did (the child is then gone)
        self.calls: list[str] = []  # every call made, in order: a reproducer's steps
        threading.Thread(target=self._read_loop, name=f"san-rsockets-{self.pid}", daemon=True).start()
        reply = self._wait(0, start_timeout)
        if reply is None or "error" in reply:
            self.kill()
            why = (reply or {}).get("error", {}).get("message") or f"no hello within {start_timeout} s"
            raise NotStarted(f"rsockets child {self.pid}: {why} {self._stderr_tail()}".strip())
        self.hello: dict[str, Any] = reply["result"]

    def _read_loop(self) -> None:
        stdout = self._proc.stdout
        assert stdout is not None
        with contextlib.suppress(OSError, ValueError):  # ValueError: the pipe was closed by ``kill``
            for line in stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                with self._arrived:
                    self._replies[message.get("id")] = message
                    self._arrived.notify_all()
        with self._arrived:
            self._eof = True
            self._arrived.notify_all()

    def _wait(self, rid: Any, timeout: float) -> dict[str, Any] | None:
        """The reply to ``rid``; None if none came in time or the child's output ended."""
        end = time.monotonic() + timeout
        with self._arrived:
            while rid not in self._replies:
                left = end - time.monotonic()
                if left <= 0 or self._eof:
                    return None
                self._arrived.wait(left)
            return self._replies.pop(rid)

    def _stderr_tail(self, limit: int = 1000) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")[-limit:].strip()
        except (OSError, ValueError):
            return ""

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def describe(self) -> dict[str, Any]:
        """{"pid", "library", "device", "alive", "calls"}: who it is, and the calls made so far."""
        return {**self.hello, "device": self.device, "alive": self.alive, "calls": list(self.calls)}

    def _send(self, call: str, args: dict[str, Any], background: bool = False) -> int:
        rid = next(self._ids)
        line = json.dumps({"id": rid, "call": call, "args": args, "background": background}) + "\n"
        stdin = self._proc.stdin
        assert stdin is not None
        with self._lock:
            stdin.write(line.encode())
            stdin.flush()
        self.calls.append(f"{call}({', '.join(f'{k}={v!r:.40}' for k, v in args.items())})"
                          + (" in the background" if background else ""))
        return rid

    def call(self, call: str, args: dict[str, Any] | None = None, deadline: float = 30.0) -> dict[str, Any]:
        """{"result": ...}, {"error": {"call", "errno", "message"}}, or {"hang": {...}} (the child was killed),
        or {"gone": ...} (it had died or was killed by an earlier hang)."""
        gone = self._gone()
        if gone is not None:
            return gone
        try:
            rid = self._send(call, args or {})
        except OSError:
            return self._gone() or {"gone": f"child {self.pid} is gone"}
        return self._outcome(call, rid, deadline)

    def start(self, call: str, args: dict[str, Any] | None = None) -> int:
        """A call run in the background (``accept``): ``finish`` waits for its outcome."""
        return self._send(call, args or {}, background=True)

    def finish(self, rid: int, call: str, deadline: float = 30.0) -> dict[str, Any]:
        return self._outcome(call, rid, deadline)

    def _outcome(self, call: str, rid: int, deadline: float) -> dict[str, Any]:
        reply = self._wait(rid, deadline)
        if reply is not None:
            return {k: reply[k] for k in ("result", "error") if k in reply}
        if not self.alive or self._eof:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)  # its output ended: its exit code follows
            return self._gone() or {"gone": f"child {self.pid} closed its output during {call}"}
        self.hang = self._hung(call, deadline)
        return {"hang": self.hang}

    def _gone(self) -> dict[str, Any] | None:
        if self.hang is not None:
            return {"gone": f"child {self.pid} was killed when {self.hang['call']} hung"}
        if self._proc.poll() is not None:
            return {"gone": f"child {self.pid} exited (code {self._proc.returncode}): {self._stderr_tail()}"}
        return None

    def _hung(self, call: str, deadline: float) -> dict[str, Any]:
        """What the hung process does (CPU share over one second, state) and holds, then kill it."""
        ticks = os.sysconf("SC_CLK_TCK")
        before, t0 = _ticks(self.pid), time.monotonic()
        time.sleep(1.0)
        after, t1 = _ticks(self.pid), time.monotonic()
        cpu = None if before is None or after is None else round((after - before) / ticks / (t1 - t0), 2)
        record: dict[str, Any] = {"call": call, "deadline": deadline, "cpu": cpu, "state": _state(self.pid),
                                  "held": self.kernel(), "steps": list(self.calls)}
        self.kill()
        record["after_kill"] = self.kernel()
        return record

    def kernel(self) -> dict[str, Any]:
        """What the kernel holds for this child now (see ``held_by``); {"unavailable": why} where unreadable."""
        if self.kernel_unavailable is not None:
            return {"unavailable": self.kernel_unavailable}
        try:
            reading = self._read()
            if self.modules:
                return held_by_modules(reading, self.modules, self._before)
            return held_by(reading, self.pid, self._before)
        except KernelUnreadable as exc:
            return {"unavailable": exc.strerror or str(exc)}

    def exit(self, deadline: float = 30.0) -> dict[str, Any]:
        """Let the child exit with whatever it holds open; {"code", "held"}: what the kernel holds afterwards.
        A child that does not exit in time is killed ({"hang": ...} as for a call)."""
        if self.alive and self.hang is None:
            with contextlib.suppress(OSError):
                self._send("exit", {})
                assert self._proc.stdin is not None
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                self.hang = self._hung("exit", deadline)
                return {"hang": self.hang}
        self.kill()
        return {"code": self._proc.returncode, "held": self.kernel()}

    def kill(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=30)
        if self._cleanup is not None and self.cleaned is None:
            self.cleaned = run_cleanup(self._cleanup)
        for pipe in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
