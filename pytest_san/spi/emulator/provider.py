"""The emulated SAN service provider: the SPI extensions, enforcing R1-R14.

Modelled on verbs, so that what passes here means the same as on real RDMA: a register_memory
handle is an lkey in the socket's table; an RDMA descriptor names a memory window bound to the
socket's connection; a protection or access error moves the connection to error and flushes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import checks
from ..contract import (
    DESCRIPTOR,
    MAX_RDMA_SIZE,
    PAGE_SIZE,
    QUEUE_DEPTH,
    RDMA_THRESHOLD,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    Access,
    Status,
)
from .process import EmulatedProcess
from .sockets import EmulatedOperation, EmulatedRegistration, EmulatedSocket, SocketState

if TYPE_CHECKING:
    from .fabric import Fabric
    from .proxy import EmulatedProxy

_READ, _WRITE = int(Access.READ), int(Access.WRITE)
_CLOSED = SocketState.CLOSED
_CONNECTED = SocketState.CONNECTED

Segment = tuple[bytearray, int, int]  # (bytes, offset, length)
_OPTIONS = {SO_MAX_RDMA_SIZE: MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE: RDMA_THRESHOLD}  # getsockopt's answers


class EmulatedProvider:
    """A provider on one emulated node. Callers identify themselves by their socket (its process)."""

    def __init__(self, node_name: str, proxy: EmulatedProxy, fabric: Fabric, handle_base: int) -> None:
        self.node_name = node_name
        self.proxy = proxy
        self._fabric = fabric
        self._handles = itertools.count(handle_base)
        self.sockets: list[EmulatedSocket] = []

    @property
    def supports_rdma_read(self) -> bool:
        return True

    # -- sockets --------------------------------------------------------------------------

    def new_socket(self, process: EmulatedProcess) -> EmulatedSocket:
        """One end of a connection EmulatorBackend.connect_sockets makes: it checked ``process`` (alive, ours)."""
        sock = EmulatedSocket(self, process, self._fabric.next_id())
        self.sockets.append(sock)
        process.sockets.append(sock)
        return sock

    def _socket(self, socket: object) -> EmulatedSocket:
        """The caller's socket, open and ours, or WSAENOTSOCK (the first check of every call)."""
        if type(socket) is EmulatedSocket and socket.provider is self and socket.state is not _CLOSED:
            return socket
        return checks.socket(None, socket, self.node_name)  # raises

    # -- registration ---------------------------------------------------------------------

    def _register(self, sock: EmulatedSocket, buffer: Any, access: Any, kind: str,
                  table: dict[int, EmulatedRegistration], descriptor_size: Any = None) -> EmulatedRegistration:
        process = sock._process
        address, length = checks.registration_objects(buffer, process)
        not_connected = None if sock.state is _CONNECTED else f"{sock!r} is not connected"
        # The range is looked up in the caller's own address space, never trusted from the buffer.
        address, length, acc, mem, offset = checks.registration_values(kind, address, length, access, descriptor_size,
                                                                       not_connected, process.resolve)
        key = (kind, address, length, int(acc))
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1
            return reg
        allocation = self.proxy.allocate(address % PAGE_SIZE + length)  # R12: the proxy pins the pages
        reg = EmulatedRegistration(kind, next(self._handles), address, length, acc, mem, offset, allocation)
        table[reg.handle] = reg
        sock.by_range[key] = reg
        return reg

    def _release(self, sock: EmulatedSocket, reg: EmulatedRegistration,
                 table: dict[int, EmulatedRegistration], force: bool = False) -> None:
        if not force:  # checks.deregistration refused it in use
            reg.refs -= 1
            if reg.refs:
                return
        del table[reg.handle]
        del sock.by_range[reg.key]
        self.proxy.free(reg.allocation)

    def register_memory(self, socket: Any, buffer: Any, access: Access) -> int:
        sock = self._socket(socket)
        return self._register(sock, buffer, access, "memory", sock.handles).handle

    def deregister_memory(self, socket: Any, handle: int) -> None:
        sock = self._socket(socket)
        reg = checks.deregistration(sock.handles.get(handle) if type(handle) is int else None, handle)
        self._release(sock, reg, sock.handles)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Access,
                             descriptor_size: int | None = None) -> bytes:
        sock = self._socket(socket)
        reg = self._register(sock, buffer, access, "rdma", sock.windows, descriptor_size)
        return DESCRIPTOR.pack(reg.address, reg.length, reg.handle)

    def deregister_rdma_memory(self, socket: Any, descriptor: bytes) -> None:
        sock = self._socket(socket)
        desc = checks.descriptor(descriptor)
        reg = checks.deregistration(sock.windows.get(DESCRIPTOR.unpack(desc)[2]), desc)
        self._release(sock, reg, sock.windows)

    def registrations(self, socket: Any) -> Sequence[EmulatedRegistration]:
        """Live registrations of one of our sockets (none once it is closed)."""
        if type(socket) is not EmulatedSocket or socket.provider is not self:
            self._socket(socket)  # raises, with the message
        return [*socket.handles.values(), *socket.windows.values()]

    def getsockopt(self, socket: Any, option: int) -> int:
        self._socket(socket)
        return _OPTIONS[checks.option(option)]

    # -- data transfer --------------------------------------------------------------------

    def _post(self, socket: Any, buffers: Any, kind: str, descriptor: Any,
              offset: Any) -> tuple[EmulatedOperation, list[tuple[int, int, Any]]]:
        """Every check of the call (pytest_san.spi.checks' order): a new operation and its (address, length,
        handle) entries. ``descriptor`` and ``offset`` are None for send and recv."""
        sock = self._socket(socket)
        entries = checks.transfer_objects(kind, buffers, sock._process)
        if kind == "recv":
            queued = len(sock.recv_queue)
        else:  # held operations, and sends waiting for the peer's receives (the peer is connected to us only)
            peer = sock.peer
            assert peer is not None  # every socket is made connected
            queued = len(sock.held or ()) + len(peer.inbound)
        not_connected = None if sock.state is _CONNECTED else f"{sock!r} is not connected"
        full = f"{kind} queue of {sock!r} is full ({QUEUE_DEPTH})" if queued >= QUEUE_DEPTH else None
        entries = checks.transfer_values(kind, entries, descriptor, offset, not_connected, None, full)
        return EmulatedOperation(sock, kind), entries

    def _gather(self, op: EmulatedOperation, entries: list[tuple[int, int, Any]], need: int) -> bool:
        """Check the local (address, length, handle) entries like an HCA checks lkeys; keep the segments.

        False: an lkey check failed (no byte may move: the caller completes ``op`` LOCAL_PROTECTION); then
        nothing is marked in use. A zero-length entry moves nothing.
        """
        handles = op.socket.handles
        regs: list[EmulatedRegistration] = []
        segments = op.segments
        total = 0
        for address, length, handle in entries:
            reg = handles.get(handle) if type(handle) is int else None
            if (reg is None or not reg.flags & need or address < reg.address
                    or address + length > reg.address + reg.length):
                segments.clear()
                return False
            regs.append(reg)
            segments.append((reg.mem, reg.offset + address - reg.address, length))
            total += length
        for reg in regs:
            reg.in_use += 1
        op.regs = regs
        op.nbytes = total
        return True

    def _start(self, op: EmulatedOperation, run: Any) -> EmulatedOperation:
        sock = op.socket
        if sock.held is not None:
            op.run = run
            sock.held.append(op)
        else:
            run(op)
        return op

    def rdma_write(self, socket: Any, local_buffers: Sequence[tuple[Any, int]], target_descriptor: bytes,
                   offset: int = 0) -> EmulatedOperation:
        return self._rdma(socket, local_buffers, target_descriptor, offset, "rdma_write")

    def rdma_read(self, socket: Any, local_buffers: Sequence[tuple[Any, int]], source_descriptor: bytes,
                  offset: int = 0) -> EmulatedOperation:
        return self._rdma(socket, local_buffers, source_descriptor, offset, "rdma_read")

    def _rdma(self, socket: Any, buffers: Sequence[tuple[Any, int]], descriptor: bytes, offset: int,
              kind: str) -> EmulatedOperation:
        op, entries = self._post(socket, buffers, kind, descriptor, offset)
        rkey = DESCRIPTOR.unpack(descriptor)[2]
        if not self._gather(op, entries, _READ if kind == "rdma_write" else _WRITE):
            return self._start(op, lambda o: self._fail(o, Status.LOCAL_PROTECTION))
        return self._start(op, lambda o: self._run_rdma(o, rkey, offset))

    def _reachable_peer(self, op: EmulatedOperation) -> EmulatedSocket | None:
        """The peer socket, or None after completing ``op`` as a flushed QP would.

        An operation runs at its post, on a connected socket, or when ``release_held`` releases it. Whatever
        ended the connection while it was held (a close, a dropped link, a dead process) completed it then;
        only one that an operation released before it broke (an error completion) is still pending here.
        """
        sock = op.socket
        if sock.state is _CONNECTED:
            return sock.peer
        op.complete(Status.ABORTED)
        return None

    def _run_rdma(self, op: EmulatedOperation, rkey: int, offset: int) -> None:
        peer = self._reachable_peer(op)
        if peer is None:
            return
        # The responder checks the window: bound to this connection (R2), registered (R3),
        # the right access (R6, R7) and in bounds (R8).
        win = peer.windows.get(rkey)
        nbytes = op.nbytes
        write = op.kind == "rdma_write"
        if (win is None or not win.flags & (_WRITE if write else _READ) or offset < 0
                or offset + nbytes > win.length or not peer._process.alive):
            self._fail(op, Status.ACCESS_VIOLATION)
            return
        remote = [(win.mem, win.offset + offset, nbytes)]
        if write:
            _copy(remote, op.segments)
        else:
            _copy(op.segments, remote)
        op.succeed(nbytes)

    def send(self, socket: Any, buffers: Sequence[tuple[Any, int]]) -> EmulatedOperation:
        op, entries = self._post(socket, buffers, "send", None, None)
        if not self._gather(op, entries, _READ):
            return self._start(op, lambda o: self._fail(o, Status.LOCAL_PROTECTION))
        return self._start(op, self._run_send)

    def _run_send(self, op: EmulatedOperation) -> None:
        peer = self._reachable_peer(op)
        if peer is None:
            return
        if peer.recv_queue:
            _deliver(op, peer.recv_queue.popleft())
        else:
            peer.inbound.append(op)  # receiver not ready: RNR-retry until it posts

    def recv(self, socket: Any, buffers: Sequence[tuple[Any, int]]) -> EmulatedOperation:
        op, entries = self._post(socket, buffers, "recv", None, None)
        if not self._gather(op, entries, _WRITE):
            self._fail(op, Status.LOCAL_PROTECTION)
            return op
        sock = op.socket
        if sock.inbound:
            _deliver(sock.inbound.popleft(), op)
        else:
            sock.recv_queue.append(op)
        return op

    def _fail(self, op: EmulatedOperation, status: Status) -> None:
        """An error completion; like verbs, it moves the connection to error and flushes it."""
        op.complete(status)
        self._fabric.break_connection(op.socket)

    # -- teardown -------------------------------------------------------------------------

    def close_socket(self, socket: Any) -> None:
        sock = self._socket(socket)
        for op in sock.pending():
            op.complete(Status.ABORTED)
        sock.recv_queue.clear()
        # The peer's own pending operations end with the connection (a closed peer: nothing to do).
        peer = sock.peer
        assert peer is not None  # every socket is made connected
        self._fabric.disconnect(peer, Status.CONNECTION_RESET)
        # The provider releases what the switch could not: memory of pending operations (R11).
        self._release_all(sock)
        sock.state = SocketState.CLOSED
        self.sockets.remove(sock)

    def _release_all(self, sock: EmulatedSocket) -> None:
        for table in (sock.handles, sock.windows):
            for reg in list(table.values()):
                self._release(sock, reg, table, force=True)

    def hold(self, socket: EmulatedSocket) -> None:
        """Fault injection: operations posted on ``socket`` stay pending until ``release_held``."""
        sock = self._socket(socket)
        if sock.held is None:
            sock.held = []

    def release_held(self, socket: EmulatedSocket) -> None:
        """EmulatorFaults.release checked that ``socket`` is ours. Closing completed what it held (ABORTED)."""
        held, socket.held = socket.held or [], None
        for op in held:
            if not op.done():
                run = op.run
                assert callable(run)
                run(op)



def _deliver(send: EmulatedOperation, recv: EmulatedOperation) -> None:
    if send.nbytes > recv.nbytes:
        recv.complete(Status.LOCAL_LENGTH)
        send.complete(Status.REMOTE_OPERATION)
        fabric = recv.socket.provider._fabric
        fabric.break_connection(recv.socket)
        return
    _copy(recv.segments, send.segments)
    recv.complete(Status.SUCCESS, send.nbytes)
    send.complete(Status.SUCCESS, send.nbytes)


def _copy(dst: list[Segment], src: list[Segment]) -> None:
    """Scatter the bytes of ``src`` segments into ``dst`` segments, in order.

    Each piece is one memmove (overlap-safe), from a memoryview into a memoryview: a bytearray slice
    assigned anything but a bytearray would first copy it into a temporary one, twice the work. The
    views are temporaries, released at once: nothing stays pinned.
    """
    if len(dst) == 1 and len(src) == 1:  # the common case: one copy, no loop
        (dmem, doff, _), (smem, soff, n) = dst[0], src[0]
        memoryview(dmem)[doff:doff + n] = memoryview(smem)[soff:soff + n]
        return
    di, dpos = 0, 0
    for smem, soff, slen in src:
        view = memoryview(smem)
        while slen:
            dmem, doff, dlen = dst[di]
            n = min(slen, dlen - dpos)
            memoryview(dmem)[doff + dpos:doff + dpos + n] = view[soff:soff + n]
            soff += n
            slen -= n
            dpos += n
            if dpos == dlen:
                di, dpos = di + 1, 0
