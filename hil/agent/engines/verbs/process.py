"""One modelled process = one real OS process: its own pyverbs Context and CQ, a PD per socket.

Everything a SAN provider keeps for the sockets of one process lives here, on real verbs objects:

* buffers: anonymous mmap'd memory at real virtual addresses (ctypes), each followed by a
  PROT_NONE guard page so no range can run from one buffer into the next;
* per socket a protection domain and an RC QP in it, connected through the RDMA connection manager
  (``socket_listen`` -> {address, port} for the peer; ``socket_connect`` to such a listener; the
  listening child accepts by itself: connections.py);
* register_memory: one MR per registration (access 0 for READ, LOCAL_WRITE for WRITE/READWRITE)
  in the socket's PD; the handle IS the MR's lkey, so a handle from another process (another
  Context) or another socket (another PD) reaches the NIC and fails there (R1). The READ/WRITE split
  for local use is kept in software too (R6 local half, R7), as is "only on its socket";
* register_rdma_memory: where the device has type-2 memory windows, an MR with LOCAL_WRITE|MW_BIND
  and a window bound on the socket's QP (IBV_WR_BIND_MW, REMOTE_READ / REMOTE_WRITE / both); else
  an MR with those remote rights. Either way in the socket's PD, so the responder's NIC refuses it
  through any other QP (R2: both rxe and siw check an MR's PD against the QP's), after deregistration
  (R3), without the right (R6, R7) and out of bounds (R8); the descriptor packs {address, length, rkey};
* deregistration: IBV_WR_LOCAL_INV on the window rkey, dealloc the MW, dereg the MR;
* data transfer: posted work requests; completions are polled from the one CQ and their
  ibv_wc_status numbers are the contract's Status values (unknown ones become REMOTE_OPERATION);
* close_socket: CM disconnects (the peer's DISCONNECTED tells it), the QP goes to ERR, the flush
  completes pending operations ABORTED, every registration of the socket is released and the QP,
  CM ids and PD destroyed (R11).

Capabilities come from the device, never from its name: max_sge, max_sge_rd (an RDMA read with more
buffers is WSAEINVAL, "too many buffers"), type-2 windows, RDMA reads in flight, the transport.
Errors are ``pytest_san.spi.contract.SanError`` with the contract's Winsock codes. Standard library + pyverbs,
Python 3.9 compatible.

Its parts, each an object that owns its state and is handed what it needs: ``DeviceContext``
(context.py: the Context, the CQ, the device's limits), ``Buffers`` and ``NullPage`` (memory.py),
``Completions`` (completions.py: the operations, the CQ's poll, waits, the engine's own work requests),
``Sockets`` (sockets.py, with connections.py: PDs, QPs, the connection manager), ``Registrations``
(registrations.py: MRs, windows), ``Posting`` (posting.py: RDMA, send, receive; bursts.py) and
``Releases`` (releases.py: what the device would not release yet); the records they pass each other are
in records.py. ``VerbsProcess`` builds them and answers the child's requests (hil.rpc.methods.CHILD),
each by one part, or, where a request spans parts (free, close_socket, reset, leaks), in the order it
takes.
"""

from __future__ import annotations

import os
from typing import Any

from hil.agent.engines.verbs.completions import Completions
from hil.agent.engines.verbs.context import DeviceContext
from hil.agent.engines.verbs.memory import Buffers, NullPage
from hil.agent.engines.verbs.pin_witness import pages_spanned, vm_pin_pages
from hil.agent.engines.verbs.pins import Pins
from hil.agent.engines.verbs.posting import Posting
from hil.agent.engines.verbs.registrations import Registrations
from hil.agent.engines.verbs.releases import Releases
from hil.agent.engines.verbs.sockets import Sockets
from pytest_san.spi.contract import (
    PAGE_SIZE,
    SanError,
    Status,
    WsaError,
)


class VerbsProcess:
    """The provider side of one process: buffers, sockets, registrations and operations on real verbs.

    ``mw_mode``, ``address`` and ``cq_size``: see ``DeviceContext``."""

    def __init__(self, device: str, port: int = 1, address: str | None = None, mw_mode: str = "auto",
                 cq_size: int = 4096) -> None:
        self.pid = os.getpid()
        self.device = DeviceContext(device, port, address, mw_mode, cq_size)
        self.buffers = Buffers(self.pid)
        self.null_page = NullPage(self.buffers)
        self.releases = Releases()
        # Every poll first handles the connection manager's events, which the sockets own.
        self.completions = Completions(self.device, self.pid, lambda: self.sockets.pump())
        self.sockets = Sockets(self.device, self.pid, self.completions, self.null_page, self.releases)
        self.registration = Registrations(self.device, self.pid, self.buffers, self.sockets, self.completions,
                                          self.releases)
        self.posting = Posting(self.device, self.sockets, self.completions, self.null_page)
        self.pins = Pins(self.buffers)
        self.vm_pin_base = vm_pin_pages(self.pid) or 0  # what it pinned before any registration
        self.closed = False

    def hello(self) -> dict[str, Any]:
        return {"pid": self.pid, **self.device.hello(), "max_sockets": self.device.max_sockets}

    def _pinned_pages(self, sockets: list[dict[str, Any]]) -> int:
        """The pages this process's MRs pin, as its books say: each registration's, the null page's, those the
        device would not release yet (pin_witness.py compares them, with the proxy's pins, to VmPin)."""
        mrs = [(r["address"], r["length"]) for s in sockets for r in s["registrations"]]
        mrs += [(0, PAGE_SIZE) for s in sockets for _ in s["mrs"]]
        mrs += [(int(o.buf), int(o.length)) for o in self.releases.held if type(o).__name__ == "MR"]
        return sum(pages_spanned(address, length) for address, length in mrs)

    # -- memory ---------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> dict[str, int]:
        return self.buffers.alloc(nbytes)

    def free(self, address: int) -> None:
        self.buffers.free(address, (reg for _, reg in self.registration.all()))

    def read(self, address: int, length: int) -> bytes:
        return self.buffers.read(address, length)

    def write(self, address: int, data: bytes) -> None:
        self.buffers.write(address, data)

    # -- DO_DIRECT_IO: this process's own pages pinned by the kernel module (pins.py) -------------

    def proxy_pin(self, address: int, length: int) -> dict[str, Any]:
        return self.pins.pin(address, length)

    def proxy_unpin(self, pin_id: int) -> None:
        self.pins.unpin(pin_id)

    def proxy_frames(self, address: int, length: int) -> list[list[int]]:
        return self.pins.frames(address, length)

    # -- sockets --------------------------------------------------------------------------------

    def socket_listen(self) -> dict[str, Any]:
        self._check_open()
        return self.sockets.listen()

    def socket_connect(self, peer: dict[str, Any]) -> dict[str, Any]:
        self._check_open()
        return self.sockets.connect(peer)

    def socket_state(self, socket: int) -> str:
        return self.sockets.state(socket)

    def socket_peer_closed(self, socket: int, status: int = Status.CONNECTION_RESET.value) -> None:
        self.sockets.peer_closed(socket, status)

    def getsockopt(self, socket: int, option: int) -> int:
        return self.sockets.getsockopt(socket, option)

    @staticmethod
    def supports_rdma_read() -> bool:
        return True

    def close_socket(self, socket: int) -> None:
        """Pending operations complete ABORTED; every registration is released; the QP, CM ids and PD
        are destroyed (R11). The peer learns it from CM (DISCONNECTED), or from the controller."""
        sock = self.sockets.get(socket)
        self.sockets.shut(sock)
        self.registration.release_all(sock)
        self.sockets.remove(sock)

    def cm_fds(self) -> list[int]:
        return self.sockets.cm_fds()

    def pump(self) -> int:
        return self.sockets.pump()

    # -- registrations --------------------------------------------------------------------------

    def register_memory(self, socket: int, address: int, length: int, access: int) -> int:
        return self.registration.register_memory(socket, address, length, access)

    def deregister_memory(self, socket: int, handle: int) -> None:
        self.registration.deregister_memory(socket, handle)

    def register_rdma_memory(self, socket: int, address: int, length: int, access: int,
                             descriptor_size: int | None = None) -> bytes:
        return self.registration.register_rdma_memory(socket, address, length, access, descriptor_size)

    def deregister_rdma_memory(self, socket: int, descriptor: bytes) -> None:
        self.registration.deregister_rdma_memory(socket, descriptor)

    def registrations(self, socket: int) -> list[dict[str, Any]]:
        return self.registration.registrations(socket)

    # -- operations -----------------------------------------------------------------------------

    def rdma_write(self, socket: int, buffers: Any, descriptor: bytes, offset: int = 0) -> int:
        return self.posting.rdma_write(socket, buffers, descriptor, offset)

    def rdma_read(self, socket: int, buffers: Any, descriptor: bytes, offset: int = 0) -> int:
        return self.posting.rdma_read(socket, buffers, descriptor, offset)

    def rdma_write_burst(self, socket: int, buffers: Any, descriptor: bytes, offset: int = 0, count: int = 1,
                         depth: int = 16) -> int:
        return self.posting.rdma_write_burst(socket, buffers, descriptor, offset, count, depth)

    def rdma_read_burst(self, socket: int, buffers: Any, descriptor: bytes, offset: int = 0, count: int = 1,
                        depth: int = 16) -> int:
        return self.posting.rdma_read_burst(socket, buffers, descriptor, offset, count, depth)

    def send(self, socket: int, buffers: Any) -> int:
        return self.posting.send(socket, buffers)

    def recv(self, socket: int, buffers: Any) -> int:
        return self.posting.recv(socket, buffers)

    def op_done(self, op_id: int) -> bool:
        return self.completions.op_done(op_id)

    def op_wait(self, op_id: int, timeout: float | None = 10.0) -> dict[str, Any]:
        return self.completions.op_wait(op_id, timeout)

    # -- books and teardown ---------------------------------------------------------------------

    def kernel_declared(self) -> dict[str, Any]:
        """What this process holds in the kernel, as its books say (the kernel witness compares it with the
        kernel's own record, witness.py): per open socket its registrations as ``registrations`` reports them,
        the engine's own MRs (the null page's, NullPage), its QP, PD and CM ids; its context and CQ; and what
        librdmacm holds for it: a context once a CM id bound to the device (kept), a PD while any CM id is
        bound there (rdma-core's ucma_get_device / ucma_put_device)."""
        sockets = []
        for sock in self.sockets.open():
            page = self.null_page.mrs.get(sock.id)
            mrs = [] if page is None else [{"what": "null page", "lkey": int(page.lkey), "length": PAGE_SIZE}]
            sockets.append({"id": sock.id, "registrations": self.registrations(sock.id), "mrs": mrs,
                            "qp": int(sock.qp is not None), "pd": int(sock.pd is not None),
                            "cm_id": sum(cm is not None for cm in (sock.cmid, sock.listener))})
        cm_used = self.sockets.made > 0  # every socket connects through the CM
        cm_ids = any(s["cm_id"] for s in sockets)
        return {"pid": self.pid, "ctx": 1 + int(cm_used), "cq": 1, "pd": int(cm_ids), "sockets": sockets,
                "vm_pin_pages": self._pinned_pages(sockets), "vm_pin_base": self.vm_pin_base}

    def leaks(self) -> list[str]:
        """Registrations still alive on open sockets, and verbs objects the device would not release."""
        return self.registration.leaks() + self.releases.leaks(self.pid)

    def reset(self) -> None:
        """Close every socket (releasing its registrations); buffers stay. The host forgets every socket
        and operation at a reset, so their records go too (this process may serve a whole session)."""
        for sock in self.sockets.open():
            self.close_socket(sock.id)
        self.completions.clear()
        self.sockets.forget_closed()
        self.releases.retry()

    def _check_open(self) -> None:
        if self.closed:
            raise SanError(WsaError.WSAENOTSOCK, f"pid {self.pid} has shut down")

    def close(self) -> None:
        """Release everything explicitly (the kernel would when the process dies)."""
        if self.closed:
            return
        self.reset()
        self.releases.retry()
        self.pins.close()
        self.buffers.close()
        self.device.close()
        self.closed = True


__all__ = ["SanError", "VerbsProcess", "WsaError"]
