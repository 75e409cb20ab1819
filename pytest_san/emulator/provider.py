"""The emulated SAN service provider: the SPI extensions, enforcing R1-R14.

Modelled on verbs, so that what passes here means the same as on real RDMA: a register_memory
handle is an lkey in the socket's table; an RDMA descriptor names a memory window bound to the
socket's connection; a protection or access error moves the connection to error and flushes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..contract import (
    DESCRIPTOR,
    DESCRIPTOR_SIZE,
    MAX_RDMA_SIZE,
    MAX_SGE,
    PAGE_SIZE,
    QUEUE_DEPTH,
    RDMA_THRESHOLD,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    Access,
    SanError,
    Status,
    WsaError,
)
from ..contract import is_int as _is_int
from .process import EmulatedBuffer, EmulatedProcess
from .sockets import EmulatedOperation, EmulatedRegistration, EmulatedSocket, SocketState, Waitable

if TYPE_CHECKING:
    from .fabric import Fabric
    from .proxy import EmulatedProxy

_ACCESS = {1: Access.READ, 2: Access.WRITE, 3: Access.READWRITE}  # validates (after a type check): one lookup
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
        if type(process) is not EmulatedProcess:
            raise TypeError(f"new_socket takes an EmulatedProcess, got {process!r:.80}")
        if process.node.base_provider is not self:
            raise ValueError(f"{process!r} is not a process of {self.node_name}")
        if not process.alive:
            raise SanError(WsaError.WSAENOTCONN, f"cannot open a socket: {process!r} is gone")
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
        if type(buffer) is EmulatedBuffer:
            address, length, owner = buffer.address, buffer.length, buffer._process
        else:
            address, length, owner = _buffer_fields(buffer, "buffer")
        process = sock._process
        if owner is not process:
            # Refused before the flags are looked at, as the verbs provider does (another process's address
            # means nothing in the caller's verbs process): a call with several faults answers the same everywhere.
            raise SanError(WsaError.WSAEFAULT, f"a buffer of pid {getattr(owner, 'pid', owner)!r:.40} is not in "
                                               f"the address space of pid {process.pid}")
        # Exactly the ints (or Access values) 1, 2, 3: True and 1.0 hash like 1 but are no flags.
        acc = _ACCESS.get(access) if type(access) is Access or type(access) is int else None
        if acc is None:
            raise SanError(WsaError.WSAEINVAL, f"access flags {access!r:.80} are not READ, WRITE or READWRITE")
        if sock.state is not _CONNECTED:
            raise SanError(WsaError.WSAENOTCONN, f"{sock!r} is not connected")
        if type(address) is not int or type(length) is not int or length <= 0:
            address, length = _range(address, length, "buffer")
            if length == 0:
                raise SanError(WsaError.WSAEFAULT, "an empty buffer cannot be registered")
        # The range is looked up in the caller's own address space, never trusted from the object.
        mem, offset = process.resolve(address, length)
        if mem is None:
            raise SanError(WsaError.WSAEFAULT, f"{length} bytes at {address:#x} are not wholly inside "
                           f"the address space of pid {process.pid}")
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
        if descriptor_size is not None:
            if type(descriptor_size) is not int and not _is_int(descriptor_size):
                raise SanError(WsaError.WSAEINVAL, f"descriptor_size is an integer or None, "
                                                   f"got {descriptor_size!r:.80}")
            if descriptor_size < DESCRIPTOR_SIZE:
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
        """Live registrations of one of our sockets (none once it is closed)."""
        if type(socket) is not EmulatedSocket or socket.provider is not self:
            self._socket(socket)  # raises, with the message
        return [*socket.handles.values(), *socket.windows.values()]

    def getsockopt(self, socket: Any, option: int) -> int:
        self._socket(socket)
        if _is_int(option):
            if option == SO_MAX_RDMA_SIZE:
                return MAX_RDMA_SIZE
            if option == SO_RDMA_THRESHOLD_SIZE:
                return RDMA_THRESHOLD
        raise SanError(WsaError.WSAEINVAL, f"unknown socket option {option!r:.80}")

    # -- data transfer --------------------------------------------------------------------

    def _post(self, socket: Any, buffers: Sequence[tuple[Any, int]], kind: str) -> EmulatedOperation:
        sock = self._connected(socket)
        if type(buffers) is not list and type(buffers) is not tuple:
            name = "local_buffers" if kind.startswith("rdma") else "buffers"
            raise TypeError(f"{name} must be a list of (buffer, handle) pairs, got {buffers!r:.80}")
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

    def _gather(self, op: EmulatedOperation, buffers: Sequence[Any], need: int) -> bool:
        """Check the local (buffer, handle) pairs like an HCA checks lkeys; keep the segments.

        Every entry is checked first: one that is not a (buffer, handle) pair is a TypeError, a
        buffer of negative length (or non-integer range) WSAEINVAL, another process's buffer
        WSAEFAULT, at the call (as on verbs, where its address means nothing in the caller's process).
        Only when all are well formed is anything marked in use. False: an lkey check failed (no byte
        may move: the caller completes ``op`` LOCAL_PROTECTION). A zero-length entry moves nothing.
        """
        sock = op.socket
        process = sock._process
        handles = sock.handles
        regs: list[EmulatedRegistration] = []
        segments = op.segments
        total = 0
        ok = True
        foreign = None
        for pair in buffers:
            if not _is_pair(pair):
                raise _not_a_pair(op, buffers, pair)
            buffer, handle = pair
            if type(buffer) is EmulatedBuffer:
                address, length, owner = buffer.address, buffer.length, buffer._process
            else:
                address, length, owner = _buffer_fields(buffer, _entry_name(op, buffers, pair))
            if type(address) is not int or type(length) is not int or length < 0:
                address, length = _range(address, length, _entry_name(op, buffers, pair))
            if owner is not process:
                foreign = foreign or _entry_name(op, buffers, pair)
            if not ok or foreign:
                continue  # the rest is still checked for malformed entries
            reg = handles.get(handle) if type(handle) is int else None
            if (reg is None or not reg.flags & need or address < reg.address
                    or address + length > reg.address + reg.length):
                ok = False
                continue
            regs.append(reg)
            segments.append((reg.mem, reg.offset + address - reg.address, length))
            total += length
        if foreign:
            raise SanError(WsaError.WSAEFAULT, f"{foreign} is a buffer of another process than pid {process.pid}")
        if not ok:
            segments.clear()
            return False
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
        op = self._post(socket, buffers, kind)
        for pair in buffers:  # a malformed scatter list is the TypeError whatever else is wrong (as over hil)
            if not _is_pair(pair):
                raise _not_a_pair(op, buffers, pair)
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
        sock = op.socket
        peer = sock.peer
        fabric = self._fabric
        # _reachable_peer's checks, inline; with no link down (the usual case) no node pair to build.
        if (sock.state is not _CONNECTED or peer is None
                or (fabric._down and not fabric.link_up(self, peer.provider))):
            peer = self._reachable_peer(op)  # completes op as a flushed or reset QP would
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
        start = win.offset + offset
        segments = op.segments
        if len(segments) == 1:  # one local buffer: one copy, as _copy makes it, without its lists
            mem, off, _ = segments[0]
            if write:
                dmem, doff, smem, soff = win.mem, start, mem, off
            else:
                dmem, doff, smem, soff = mem, off, win.mem, start
            if soff == 0 and nbytes == len(smem) and 0 <= doff <= len(dmem) - nbytes:
                dmem[doff:doff + nbytes] = smem  # a whole mapping: straight in, no views to make
            else:
                memoryview(dmem)[doff:doff + nbytes] = memoryview(smem)[soff:soff + nbytes]
        elif write:
            _copy([(win.mem, start, nbytes)], segments)
        else:
            _copy(segments, [(win.mem, start, nbytes)])
        op.succeed(nbytes)

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
        sock.held = sock.held if sock.held is not None else []

    def release_held(self, socket: EmulatedSocket) -> None:
        if type(socket) is not EmulatedSocket or socket.provider is not self:
            self._socket(socket)  # raises (a closed socket of ours is fine: nothing is held there)
        held, socket.held = socket.held or [], None
        for op in held:
            if not op.done():
                run = op.run
                assert callable(run)
                run(op)



def _buffer_fields(buffer: object, what: str) -> tuple[Any, Any, Any]:
    """(address, length, process) of a buffer-like object that is not an EmulatedBuffer."""
    try:
        return buffer.address, buffer.length, buffer.process  # type: ignore[attr-defined]
    except AttributeError:
        raise TypeError(f"{what} must be a buffer (.address, .length, .process), got {buffer!r:.80}") from None


def _range(address: object, length: object, what: str) -> tuple[int, int]:
    """A buffer's (address, length) as ints; WSAEINVAL when they are not integers or the length is negative."""
    if not _is_int(address) or not _is_int(length):
        raise SanError(WsaError.WSAEINVAL, f"{what}: address and length must be integers, "
                                           f"got {address!r:.40} and {length!r:.40}")
    if length < 0:  # type: ignore[operator]
        raise SanError(WsaError.WSAEINVAL, f"{what}: a negative length ({length}) is no range of memory")
    return int(address), int(length)  # type: ignore[call-overload]


def _entry_name(op: EmulatedOperation, buffers: Sequence[object], pair: object) -> str:
    name = "local_buffers" if op.kind.startswith("rdma") else "buffers"
    index = next(i for i, item in enumerate(buffers) if item is pair)
    return f"{name}[{index}]"


def _is_pair(pair: object) -> bool:
    """A scatter list entry of the right shape: a plain tuple or list of two (its contents judged later)."""
    return (type(pair) is tuple or type(pair) is list) and len(pair) == 2


def _not_a_pair(op: EmulatedOperation, buffers: Sequence[object], pair: object) -> TypeError:
    return TypeError(f"{_entry_name(op, buffers, pair)} is not a (buffer, handle) pair: {pair!r:.80}")


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

    Each piece is one memmove (overlap-safe): memoryviews on both sides, or, for a whole
    mapping, the bytearray itself assigned to a slice of exactly its length (never a resize).
    A bytearray slice assigned anything but a bytearray would first copy it into a temporary
    one: twice the work. The views are temporaries, released at once: nothing stays pinned.
    """
    if len(dst) == 1 and len(src) == 1:  # the common case: one copy, no loop
        (dmem, doff, _), (smem, soff, n) = dst[0], src[0]
        if soff == 0 and n == len(smem) and 0 <= doff <= len(dmem) - n:
            dmem[doff:doff + n] = smem
        else:
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
