"""A switch judged by observation: a program in another process (and another language) that a backend runs on a
node, driven call by call, and the kernel's record of what that process holds.

The first such program is rsockets (librdmacm's ``rsocket`` API, the closest Linux analogue of the Windows Sockets
switch). A backend that can run one has ``spawn_observed(node, program)`` (:class:`Observing`); the hil backend's
verbs hosts do, and declare the capability ``rsockets`` where librdmacm exports the rsocket calls. The emulator
runs no program of another language, so the scenarios that need one are skipped there.

The second is the kernel's NVMe over Fabrics on RDMA (capability ``nvme_rdma``): programs ``"nvme"`` (the kernel's
target or host on a node, :class:`NvmeFabric`, judged by what the modules hold) and ``"nvme-rogue"`` (a target of
ours that tries what the host advertised, :class:`RogueTarget`).

Every call waits at most its deadline. Its outcome is a mapping with exactly one of:

* ``"result"``: what the call returned;
* ``"error"``: ``{"call", "errno", "message"}``, the call failed;
* ``"hang"``: ``{"call", "deadline", "cpu", "state", "held", "after_kill", "steps"}``, the call did not return
  within its deadline: the process was measured (its CPU share over a second, its scheduler state), what the
  kernel held for it was read, and it was killed;
* ``"gone"``: a string, the process had ended before (killed when an earlier call hung, or it crashed).

``kernel()`` is what the kernel holds for the process now, read by thread group (a library's helper thread makes
objects too): ``{"mr": [{"mrn", "length", "lkey", "rkey", "pdn", "iova"}], "qp": [...], "pd": [...], "cq": [...],
"cm_id": [...], "ctx": [...], "unowned": {kind: [...]}}`` (``unowned``: objects no thread owns any more, made since
the process started; keys only where the reader may see them), or ``{"unavailable": why}``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .spi.protocols import Node

__all__ = ["CallFailed", "CallHung", "Calls", "NvmeFabric", "Observed", "ObservedProcess", "Observing", "ProcessGone",
           "RogueTarget", "RsocketsProcess"]

Outcome = Mapping[str, Any]
"""Exactly one of ``result``, ``error``, ``hang``, ``gone`` (see the module's docstring)."""


class ObservedProcess(Protocol):
    """A process under observation, as a backend hands it out."""

    @property
    def pid(self) -> int: ...

    def call(self, call: str, args: Mapping[str, object] | None = None, deadline: float = 30.0) -> Outcome: ...

    def start(self, call: str, args: Mapping[str, object] | None = None) -> int:
        """A call run in the background (one that waits for another process, such as ``accept``)."""
        ...

    def finish(self, started: int, call: str, deadline: float = 30.0) -> Outcome: ...

    def kernel(self) -> Mapping[str, Any]: ...

    def exit(self, deadline: float = 30.0) -> Outcome:
        """Let the process exit with whatever it holds: ``{"code", "held"}`` (what the kernel holds afterwards),
        or ``{"hang": ...}``."""
        ...

    def kill(self) -> None: ...


@runtime_checkable
class Observing(Protocol):
    """A backend that runs programs under observation on its nodes."""

    def spawn_observed(self, node: Node, program: str) -> ObservedProcess: ...


class Observed(Exception):
    """An outcome other than a result, as an exception: ``outcome`` holds it."""

    def __init__(self, message: str, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class CallFailed(Observed):
    """The call returned an error (``errno``)."""

    @property
    def errno(self) -> int | None:
        value = self.outcome["error"].get("errno")
        return value if isinstance(value, int) else None


class CallHung(Observed):
    """The call did not return within its deadline; the process was killed."""


class ProcessGone(Observed):
    """The process had ended before the call."""


MRS_SHOWN = 8  # MR lengths a hang's line lists (a kernel module's pool holds hundreds)


def describe_hang(hang: Mapping[str, Any]) -> str:
    """One line: the call, its deadline, the process's CPU share and state, what the kernel held meanwhile (by
    module, for a program that drives one) and every call made before it, the reproducer's steps."""
    held = hang.get("held") or {}
    lengths = [str(m.get("length")) for m in held.get("mr", [])]
    mrs = ", ".join(lengths[:MRS_SHOWN]) + (f", ... ({len(lengths)} in all)" if len(lengths) > MRS_SHOWN else "")
    counts = ", ".join(f"{len(held.get(k, []))} {k}" for k in ("qp", "pd", "cq", "cm_id") if held.get(k))
    modules = held.get("modules")
    owners = f" (owned by {', '.join(f'{m}: {n}' for m, n in modules.items())})" if modules else ""
    return (f"{hang.get('call')} did not return within {hang.get('deadline')} s (CPU {hang.get('cpu')}, state "
            f"{hang.get('state')}); meanwhile the kernel held MRs of [{mrs}] bytes and {counts or 'nothing else'}"
            f"{owners}; the process was killed. Steps: {'; '.join(hang.get('steps', []))}")


def result(outcome: Outcome, what: str) -> Any:
    """The outcome's result, else the matching exception naming ``what``."""
    if "result" in outcome:
        return outcome["result"]
    if "hang" in outcome:
        raise CallHung(f"{what}: {describe_hang(outcome['hang'])}", outcome)
    if "error" in outcome:
        raise CallFailed(f"{what}: {outcome['error'].get('message')}", outcome)
    raise ProcessGone(f"{what}: {outcome.get('gone')}", outcome)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Calls:
    """A program's calls on an observed process, each raising on anything but a result (``result``); a call
    waits ``deadline`` seconds unless it says otherwise."""

    default_deadline = 30.0

    def __init__(self, process: ObservedProcess, deadline: float | None = None) -> None:
        self.process = process
        self.deadline = self.default_deadline if deadline is None else deadline

    def _do(self, call: str, deadline: float | None = None, **args: object) -> Any:
        return result(self.process.call(call, args, self.deadline if deadline is None else deadline), call)


class RsocketsProcess(Calls):
    """The calls of ``hil/agent/rsockets/child.py`` on an observed process, each raising on anything but a result."""

    def socket(self, iomap_slots: int = 0) -> int:
        fd = int(self._do("rsocket"))
        if iomap_slots:
            self._do("iomapsize", fd=fd, slots=iomap_slots)
        return fd

    def listen(self, fd: int) -> dict[str, Any]:
        where: dict[str, Any] = self._do("listen", fd=fd)
        return where

    def start_accept(self, fd: int) -> int:
        return self.process.start("accept", {"fd": fd})

    def finish_accept(self, started: int) -> int:
        return int(result(self.process.finish(started, "accept", self.deadline), "accept"))

    def connect(self, fd: int, where: Mapping[str, Any]) -> None:
        self._do("connect", fd=fd, address=where["address"], port=where["port"])

    def alloc(self, length: int) -> int:
        return int(self._do("alloc", length=length)["buf"])

    def peek(self, buf: int, length: int, offset: int = 0) -> bytes:
        return base64.b64decode(self._do("peek", buf=buf, length=length, offset=offset))

    def send(self, fd: int, data: bytes) -> int:
        return int(self._do("send", fd=fd, data=b64(data)))

    def recv(self, fd: int, length: int, deadline: float | None = None) -> bytes:
        return base64.b64decode(self._do("recv", deadline, fd=fd, length=length))

    def iomap(self, fd: int, buf: int, offset: int = -1) -> int:
        return int(self._do("iomap", fd=fd, buf=buf, offset=offset))

    def iounmap(self, fd: int, buf: int) -> None:
        self._do("iounmap", fd=fd, buf=buf)

    def iowrite(self, fd: int, data: bytes, offset: int) -> Outcome:
        """The raw outcome: a peer's write may be refused, or end the connection."""
        return self.process.call("iowrite", {"fd": fd, "data": b64(data), "offset": offset}, self.deadline)

    def close(self, fd: int, deadline: float | None = None) -> Outcome:
        """The raw outcome: ``rclose`` may hang (``{"hang": ...}``)."""
        return self.process.call("close", {"fd": fd}, self.deadline if deadline is None else deadline)


class NvmeFabric(Calls):
    """The calls of ``hil/agent/nvme/fabric.py`` (program ``"nvme"``): the kernel's NVMe-oF target or host on one
    node, each call raising on anything but a result. ``kernel()`` is what the modules ``nvme_rdma``,
    ``nvmet_rdma`` and ``rdma_cm`` hold on that node that they did not hold when the process started: per kind,
    entries with their ``module`` (a PD with its ``unsafe_global_rkey`` where it has one), and ``"modules"``:
    counts by module."""

    default_deadline = 60.0

    def target(self, nqn: str, port: int = 4420, size_mb: int = 64) -> dict[str, Any]:
        made: dict[str, Any] = self._do("target", nqn=nqn, port=port, size_mb=size_mb)
        return made

    def untarget(self) -> dict[str, Any]:
        removed: dict[str, Any] = self._do("untarget")
        return removed

    def host_module(self, register_always: str) -> dict[str, Any]:
        loaded: dict[str, Any] = self._do("host_module", 90.0, register_always=register_always)
        return loaded

    def admin_timeout(self, seconds: int) -> None:
        self._do("admin_timeout", seconds=seconds)

    def connect(self, address: str, nqn: str, hostnqn: str, **options: object) -> dict[str, Any]:
        connected: dict[str, Any] = self._do("connect", 90.0, address=address, nqn=nqn, hostnqn=hostnqn, **options)
        return connected

    def try_connect(self, address: str, nqn: str, hostnqn: str, deadline: float = 120.0,
                    **options: object) -> Outcome:
        """The raw outcome of a connect that may fail (a rogue target refuses it)."""
        return self.process.call("connect", {"address": address, "nqn": nqn, "hostnqn": hostnqn, **options},
                                 deadline)

    def io(self, namespace: str, size: int, offset: int = 0, seed: int = 1) -> dict[str, Any]:
        done: dict[str, Any] = self._do("io", namespace=namespace, size=size, offset=offset, seed=seed)
        return done

    def key_cycle(self, namespace: str, reads: int) -> dict[str, Any]:
        watched: dict[str, Any] = self._do("key_cycle", 300.0, namespace=namespace, reads=reads)
        return watched

    def disconnect(self, nqn: str) -> dict[str, Any]:
        done: dict[str, Any] = self._do("disconnect", 90.0, nqn=nqn)
        return done

    def unload(self, *modules: str) -> dict[str, Any]:
        done: dict[str, Any] = self._do("unload", 120.0, modules=list(modules))
        return done

    def kmsg(self) -> list[str]:
        return list(self._do("kmsg"))

    def parameters(self) -> dict[str, Any]:
        values: dict[str, Any] = self._do("parameters")
        return values

    def kernel(self) -> Mapping[str, Any]:
        return self.process.kernel()


class RogueTarget(Calls):
    """The calls of ``hil/agent/engines/verbs/nvme_rogue.py`` (program ``"nvme-rogue"``): a listener of ours where
    nvmet would be, which tries what the host's advertised keys allow (its module docstring says each probe)."""

    default_deadline = 60.0

    def listen(self, port: int = 4420) -> dict[str, Any]:
        where: dict[str, Any] = self._do("listen", port=port)
        return where

    def start(self, probe: str, deadline: float = 150.0) -> int:
        return self.process.start("serve", {"probe": probe, "deadline": deadline})

    def finish(self, started: int, deadline: float = 180.0) -> dict[str, Any]:
        found: dict[str, Any] = result(self.process.finish(started, "serve", deadline), "the rogue target's serve")
        return found
