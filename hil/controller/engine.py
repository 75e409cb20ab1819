"""The controller's stand-in for an agent's engine: what a host is asked as a whole (its connects, its leaks, its
reset, its kernel's record), each a remote method declared once (hil/controller/declared.py)."""

from __future__ import annotations

from typing import Any

from hil.controller.declared import declared, local, remote
from hil.controller.remote import Remote, RemoteNode, RemoteProcess, RemoteSocket, Session
from pytest_san.spi.contract import Leak


@declared
class RemoteEngine(Remote):
    def __init__(self, session: Session, oid: int, nodes: list[RemoteNode]) -> None:
        super().__init__(session, oid)
        self._nodes = nodes
        # What kernel_readings brought, until the backend takes it: kept here, so that a batch that fails on
        # another host (and so gives no outcomes) loses none of this host's readings.
        self.readings: list[Any] = []

    @property
    @local
    def nodes(self) -> list[RemoteNode]:
        return self._nodes

    @remote
    def connect_local(self, a: RemoteProcess, b: RemoteProcess) -> tuple[RemoteSocket, RemoteSocket]:
        """A connected pair of two processes of this host."""
        ref_a, ref_b = self._call("connect_local", a, b)
        return self.session.obj(ref_a, RemoteSocket, a), self.session.obj(ref_b, RemoteSocket, b)

    @remote
    def socket_listen(self, process: RemoteProcess) -> tuple[RemoteSocket, Any]:
        """A socket of ``process`` listening, and where a peer on another host connects to it."""
        ref, where = self._call("socket_listen", process)
        return self.session.obj(ref, RemoteSocket, process), where

    @remote
    def socket_connect(self, process: RemoteProcess, where: Any) -> RemoteSocket:
        """A socket of ``process`` connected to ``where`` (another host's ``socket_listen``)."""
        return self.session.obj(self._call("socket_connect", process, where), RemoteSocket, process)

    @remote
    def leaks(self) -> list[Leak]:
        """What the engine still holds (R11)."""
        return [Leak(node, kind, detail) for node, kind, detail in self._call("leaks")]

    @remote
    def reset(self) -> None:
        """Everything released; the session forgets what the agent forgot, whether the reset said it failed or not
        (a reset that did not answer leaves the agent dead, replaced)."""
        try:
            self._call("reset")
        except Exception:
            self.session.forget_unpinned()
            raise
        self.session.forget_unpinned()

    @remote
    def faults(self, name: str, *args: object) -> None:
        """Fault injection (capability ``"faults"``): ``name`` with its arguments (``RemoteFaults``)."""
        self._call("faults", name, *args)

    @remote
    def kernel_reading(self, at: str) -> Any:
        """The kernel witness's reading of the host's RDMA objects now, named ``at``."""
        return self._call("kernel_reading", at)

    @remote
    def kernel_readings(self) -> Any:
        """The kernel witness's readings since the previous reset (added to ``readings``)."""
        readings = self._call("kernel_readings")
        if isinstance(readings, list):
            self.readings += readings
        return readings
