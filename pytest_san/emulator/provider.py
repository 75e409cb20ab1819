"""The emulated SAN service provider: the SPI extensions, enforcing R1-R14.

Modelled on verbs, so that what passes here means the same as on real RDMA: a register_memory
handle is an lkey in the socket's table; an RDMA descriptor names a memory window bound to the
socket's connection; a protection or access error moves the connection to error and flushes it.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SanError, WsaError
from ..types import PAGE_SIZE, SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE, Access, Status
from .sockets import EmulatedOperation, EmulatedRegistration, EmulatedSocket, SocketState, Waitable

if TYPE_CHECKING:
    from .fabric import Fabric
    from .process import EmulatedBuffer, EmulatedProcess
    from .proxy import EmulatedProxy

DESCRIPTOR = struct.Struct("<QQI")  # address, length, window rkey: what verbs hands a peer
DESCRIPTOR_SIZE = DESCRIPTOR.size
MAX_SGE = 4
QUEUE_DEPTH = 64
MAX_RDMA_SIZE = 1 << 20
RDMA_THRESHOLD = 16 * 1024
_ACCESS = {1: Access.READ, 2: Access.WRITE, 3: Access.READWRITE}  # also validates: one dict lookup
_READ, _WRITE = int(Access.READ), int(Access.WRITE)
_CLOSED = SocketState.CLOSED
_CONNECTED = SocketState.CONNECTED

Segment = tuple[bytearray, int, int]  # (bytes, offset, length)


class EmulatedProvider:
    """A provider on one emulated node. Callers identify themselves by their socket (its process)."""

    def __init__(self, node_name: str, proxy: EmulatedProxy, fabric: Fabric, handle_base: int) -> None:
        self.node_name = node_name
        self.proxy = proxy
        self._fabric = fabric
        self._handles = itertools.count(handle_base)
        self.sockets: list[EmulatedSocket] = []
        self.waitable = Waitable()

    @property
    def supports_rdma_read(self) -> bool:
        return True

    # -- sockets --------------------------------------------------------------------------

    def new_socket(self, process: EmulatedProcess) -> EmulatedSocket:
        sock = EmulatedSocket(self, process, self._fabric.next_id(), self.waitable)
        self.sockets.append(sock)
        process.sockets.append(sock)
        return sock

    def _socket(self, socket: object) -> EmulatedSocket:
        """The caller's socket, open and ours, or WSAENOTSOCK."""
        if type(socket) is not EmulatedSocket or socket.provider is not self or socket.closed:
            raise SanError(WsaError.WSAENOTSOCK, f"{socket!r} is not an open socket of {self.node_name}")
        return socket

    def _connected(self, socket: object) -> EmulatedSocket:
        sock = self._socket(socket)
        if sock.state is not SocketState.CONNECTED:
            raise SanError(WsaError.WSAENOTCONN, f"{sock!r} is not connected")
        return sock

    # -- registration ---------------------------------------------------------------------

    def _register(self, sock: EmulatedSocket, buffer: EmulatedBuffer, access: Access, kind: str,
                  table: dict[int, EmulatedRegistration]) -> EmulatedRegistration:
        try:
            acc = _ACCESS.get(access)
        except TypeError:  # unhashable: certainly not an access flag
            acc = None
        if acc is None:
            raise SanError(WsaError.WSAEINVAL, f"access flags {access!r} are not READ, WRITE or READWRITE")
        if sock.state is not _CONNECTED:
            raise SanError(WsaError.WSAENOTCONN, f"{sock!r} is not connected")
        address, length = buffer.address, buffer.length
        # The range is looked up in the caller's own address space, never trusted from the object.
        mem, offset = sock.process.resolve(address, length)
        if mem is None or buffer.process is not sock.process:
            raise SanError(WsaError.WSAEFAULT, f"{length} bytes at {address:#x} are not wholly inside "
                           f"the address space of pid {sock.process.pid}")
        key = (kind, address, length, int(acc))
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1
            return reg
        first = address & ~(PAGE_SIZE - 1)
        allocation = self.proxy.allocate(address + length - first)  # R12: the proxy pins the pages
        reg = EmulatedRegistration(kind, next(self._handles), address, length, acc, mem, offset, allocation)
        table[reg.handle] = reg
        sock.by_range[key] = reg
        return reg

    def _release(self, sock: EmulatedSocket, reg: EmulatedRegistration,
                 table: dict[int, EmulatedRegistration], force: bool = False) -> None:
        if not force:
            if reg.in_use:
                raise SanError(WsaError.WSAEINVAL, f"{reg!r} is in use by a pending operation")
            reg.refs -= 1
            if reg.refs:
                return
        del table[reg.handle]
        del sock.by_range[reg.key]
        self.proxy.free(reg.allocation)

    def register_memory(self, socket: Any, buffer: Any, access: Access) -> int:
        if type(socket) is not EmulatedSocket or socket.provider is not self or socket.state is _CLOSED:
            self._socket(socket)  # raises, with the message
        return self._register(socket, buffer, access, "memory", socket.handles).handle

    def deregister_memory(self, socket: Any, handle: int) -> None:
        if type(socket) is not EmulatedSocket or socket.provider is not self or socket.state is _CLOSED:
            self._socket(socket)
        sock: EmulatedSocket = socket
        reg = sock.handles.get(handle) if type(handle) is int else None
        if reg is None:
            raise SanError(WsaError.WSAEINVAL, f"handle {handle!r} is not registered on {sock!r}")
        self._release(sock, reg, sock.handles)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Access,
                             descriptor_size: int | None = None) -> bytes:
        sock = self._socket(socket)
        if descriptor_size is not None and descriptor_size < DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {DESCRIPTOR_SIZE} bytes, "
                           f"{descriptor_size} offered", required_size=DESCRIPTOR_SIZE)
        reg = self._register(sock, buffer, access, "rdma", sock.windows)
        return DESCRIPTOR.pack(reg.address, reg.length, reg.handle)

    def _window_of(self, sock: EmulatedSocket, descriptor: bytes) -> EmulatedRegistration | None:
        if not isinstance(descriptor, (bytes, bytearray)) or len(descriptor) != DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {descriptor!r:.60}")
        return sock.windows.get(DESCRIPTOR.unpack(descriptor)[2])

    def deregister_rdma_memory(self, socket: Any, descriptor: bytes) -> None:
        sock = self._socket(socket)
        reg = self._window_of(sock, descriptor)
        if reg is None:
            raise SanError(WsaError.WSAEINVAL, f"descriptor {bytes(descriptor).hex()} is not registered on {sock!r}")
        self._release(sock, reg, sock.windows)

    def registrations(self, socket: Any) -> Sequence[EmulatedRegistration]:
        sock = socket if isinstance(socket, EmulatedSocket) else self._socket(socket)
        return [*sock.handles.values(), *sock.windows.values()]

    def getsockopt(self, socket: Any, option: int) -> int:
        self._socket(socket)
        if option == SO_MAX_RDMA_SIZE:
            return MAX_RDMA_SIZE
        if option == SO_RDMA_THRESHOLD_SIZE:
            return RDMA_THRESHOLD
        raise SanError(WsaError.WSAEINVAL, f"unknown socket option {option:#x}")

    # -- data transfer --------------------------------------------------------------------

    def _post(self, socket: Any, buffers: Sequence[tuple[Any, int]], kind: str) -> EmulatedOperation:
        sock = self._connected(socket)
        if len(buffers) > MAX_SGE:
            raise SanError(WsaError.WSAEINVAL, f"{len(buffers)} buffers, at most {MAX_SGE}")
        if kind == "recv":
            queued = len(sock.recv_queue)
        else:  # sends waiting for the peer's receives, and held operations
            inbound = sock.peer.inbound if sock.peer is not None else ()
            queued = len(sock.held or ()) + (sum(1 for op in inbound if op.socket is sock) if inbound else 0)
        if queued >= QUEUE_DEPTH:
            raise SanError(WsaError.WSAENETDOWN, f"{kind} queue of {sock!r} is full ({QUEUE_DEPTH})")
        return EmulatedOperation(sock, kind)

    def _gather(self, op: EmulatedOperation, buffers: Sequence[tuple[Any, int]], need: int) -> bool:
        """Check the local (buffer, handle) pairs like an HCA checks lkeys; keep the segments."""
        sock = op.socket
        total = 0
        for buffer, handle in buffers:
            reg = sock.handles.get(handle) if type(handle) is int else None
            if (reg is None or buffer.process is not sock.process or not reg.flags & need
                    or buffer.address < reg.address
                    or buffer.address + buffer.length > reg.address + reg.length):
                return False
            reg.in_use += 1
            op.regs.append(reg)
            op.segments.append((reg.mem, reg.offset + buffer.address - reg.address, buffer.length))
            total += buffer.length
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
        op = self._post(socket, buffers, kind)
        if not isinstance(descriptor, (bytes, bytearray)) or len(descriptor) != DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {descriptor!r:.60}")
        rkey = DESCRIPTOR.unpack(descriptor)[2]
        if type(offset) is not int:
            raise SanError(WsaError.WSAEINVAL, f"offset must be an integer, got {offset!r}")
        local_need = _READ if kind == "rdma_write" else _WRITE
        if not self._gather(op, buffers, local_need):
            return self._start(op, lambda o: self._fail(o, Status.LOCAL_PROTECTION))
        return self._start(op, lambda o: self._run_rdma(o, rkey, offset))

    def _reachable_peer(self, op: EmulatedOperation) -> EmulatedSocket | None:
        """The peer socket, or None after completing ``op`` as a flushed or reset QP would."""
        sock = op.socket
        if sock.state is not _CONNECTED:
            op.complete(Status.ABORTED if sock.state is SocketState.ERROR else Status.CONNECTION_RESET)
            return None
        peer = sock.peer
        assert peer is not None
        if not self._fabric.link_up(self, peer.provider):
            self._fabric.disconnect(sock, Status.CONNECTION_RESET)
            op.complete(Status.CONNECTION_RESET)
            return None
        return peer

    def _run_rdma(self, op: EmulatedOperation, rkey: int, offset: int) -> None:
        peer = self._reachable_peer(op)
        if peer is None:
            return
        # The responder checks the window: bound to this connection (R2), registered (R3),
        # the right access (R6, R7) and in bounds (R8).
        win = peer.windows.get(rkey)
        need = _WRITE if op.kind == "rdma_write" else _READ
        if (win is None or not win.flags & need or offset < 0 or offset + op.nbytes > win.length
                or not peer.process.alive):
            self._fail(op, Status.ACCESS_VIOLATION)
            return
        remote = [(win.mem, win.offset + offset, op.nbytes)]
        if op.kind == "rdma_write":
            _copy(remote, op.segments)
        else:
            _copy(op.segments, remote)
        op.complete(Status.SUCCESS, op.nbytes)

    def send(self, socket: Any, buffers: Sequence[tuple[Any, int]]) -> EmulatedOperation:
        op = self._post(socket, buffers, "send")
        if not self._gather(op, buffers, _READ):
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
        op = self._post(socket, buffers, "recv")
        if not self._gather(op, buffers, _WRITE):
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
        if sock.held is not None:
            sock.held = []
        peer = sock.peer
        if peer is not None:
            peer.inbound = type(peer.inbound)(op for op in peer.inbound if op.socket is not sock)
            if peer.state is SocketState.CONNECTED or peer.state is SocketState.ERROR:
                self._fabric.disconnect(peer, Status.CONNECTION_RESET)
        # The provider releases what the switch could not: memory of pending operations (R11).
        self.release_all(sock)
        sock.state = SocketState.CLOSED
        self.sockets.remove(sock)

    def release_all(self, sock: EmulatedSocket) -> None:
        for table in (sock.handles, sock.windows):
            for reg in list(table.values()):
                self._release(sock, reg, table, force=True)

    def hold(self, socket: EmulatedSocket) -> None:
        socket.held = socket.held if socket.held is not None else []

    def release_held(self, socket: EmulatedSocket) -> None:
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
    """Scatter the bytes of ``src`` segments into ``dst`` segments, in order."""
    if len(dst) == 1 and len(src) == 1:  # the common case: one copy, no loop
        (dmem, doff, _), (smem, soff, n) = dst[0], src[0]
        dmem[doff:doff + n] = memoryview(smem)[soff:soff + n]
        return
    di, dpos = 0, 0
    for smem, soff, slen in src:
        view = memoryview(smem)
        while slen:
            dmem, doff, dlen = dst[di]
            n = min(slen, dlen - dpos)
            dmem[doff + dpos:doff + dpos + n] = view[soff:soff + n]
            soff += n
            slen -= n
            dpos += n
            if dpos == dlen:
                di, dpos = di + 1, 0
