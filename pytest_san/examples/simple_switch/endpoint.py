"""One end of a simple-switch connection: its two message regions, its ring of receives, its transfers."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_san import SO_MAX_RDMA_SIZE, Access, Buffer, Handle, PendingOperation, Process, SanError, Status, WsaError
from pytest_san.spi.protocols import Socket

from .records import COUNT_MODULO, HEADER, LENGTH, Kind, record, take_records

if TYPE_CHECKING:
    from .switch import SimpleConnection

R = TypeVar("R")
Release = tuple[Callable[[Socket, Any], None], object]
"""How a registration is released (the provider's deregister_memory or deregister_rdma_memory) and its key."""


@dataclasses.dataclass
class Transfer:
    """A large send, on either side: the memory it moves, its registration and the RDMA in flight."""

    buffer: Buffer
    length: int
    handle: Handle | None = None  # a register_memory handle (the local side of RDMA)
    descriptor: bytes | None = None  # a register_rdma_memory descriptor (what the peer uses)
    ops: list[PendingOperation] = dataclasses.field(default_factory=list)
    data: bytes | None = None  # receiver: the bytes, once they are all there

    def busy(self) -> bool:
        return not all(op.done() for op in self.ops)


class SimpleEndpoint:
    """``.socket .process .provider .proxy`` and the application's ``send``/``recv`` (pytest_san.spi.protocols)."""

    def __init__(self, conn: SimpleConnection, name: str, socket: Socket, process: Process) -> None:
        self.conn = conn
        self.name = name
        self.socket = socket
        self.process = process
        self.provider = process.node.provider
        self.proxy = process.node.proxy
        self.peer: SimpleEndpoint
        self.closed = False
        self.error: str | None = None
        self.handles: list[Handle] = []  # the two regions' registrations: send, then receive
        self.receives: collections.deque[tuple[int, PendingOperation]] = collections.deque()
        self.sends: dict[int, PendingOperation] = {}
        self.free = collections.deque(range(conn.message_count))
        self.taken = 0  # messages taken from the receive ring (running total, sent in every header)
        self.reported = 0  # what the last message we sent said of ``taken``
        self.sent = 0
        self.peer_taken = 0
        self.outgoing = bytearray()  # our record stream, not yet in a message
        self.incoming = bytearray()  # the peer's, not yet a whole record
        self.arriving: collections.deque[Transfer | bytes] = collections.deque()  # in stream order
        self.stream = bytearray()  # the application's bytes, ready
        self.to_read: collections.deque[Transfer] = collections.deque()  # sender: exposed for the peer's RdmaRead
        self.to_sink: collections.deque[Transfer] = collections.deque()  # sender: waiting for the peer's SINK
        self.writing: collections.deque[Transfer] = collections.deque()  # sender: RdmaWrite in flight
        self.sinks: collections.deque[Transfer] = collections.deque()  # receiver: WRITE descriptors offered
        self.reading: collections.deque[Transfer] = collections.deque()  # receiver: RdmaRead in flight

    # -- provider calls, each in the connection's trace

    def call(self, fn: Callable[..., R], /, *args: Any) -> R:
        """``fn(self.socket, *args)``: a method of this end's provider, traced by its name."""
        self.conn.trace.append((self.name, fn.__name__))
        return fn(self.socket, *args)

    # -- building

    def build(self) -> None:
        """R9: two regions, one per direction, each registered once; a receive posted in every receive slot."""
        ring = self.conn.message_count * self.conn.message_size
        self.send_region = self.process.alloc(ring)
        self.recv_region = self.process.alloc(ring)
        self.handles.append(self.call(self.provider.register_memory, self.send_region, Access.READ))
        self.handles.append(self.call(self.provider.register_memory, self.recv_region, Access.WRITE))
        for slot in range(self.conn.message_count):
            self.post_receive(slot)

    def slot(self, region: Buffer, index: int) -> Buffer:
        return region.view(index * self.conn.message_size, self.conn.message_size)

    def post_receive(self, index: int) -> None:
        slot = self.slot(self.recv_region, index)
        self.receives.append((index, self.call(self.provider.recv, [(slot, self.handles[1])])))

    def send_message(self, index: int, message: bytes) -> PendingOperation:
        """``message`` into send slot ``index``, and sent from there."""
        buffer = self.slot(self.send_region, index).view(0, len(message))
        buffer.write(message)
        return self.call(self.provider.send, [(buffer, self.handles[0])])

    # -- the application's side

    def send(self, data: bytes | bytearray | memoryview) -> None:
        """R10: inline records up to the threshold, RDMA above it."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"send takes bytes, got {data!r:.80}")
        data = bytes(data)
        self.check()
        if not self.by_rdma(len(data)):
            self.outgoing += record(Kind.DATA, data)
        else:
            source = self.process.alloc(len(data))
            source.write(data)
            out = Transfer(source, len(data))
            if self.conn.reads(self.peer):
                out.descriptor = self.call(self.provider.register_rdma_memory, source, Access.READ)
                self.to_read.append(out)
                self.outgoing += record(Kind.SOURCE_READ, LENGTH.pack(len(data)) + bytes(out.descriptor))
            else:
                self.to_sink.append(out)
                self.outgoing += record(Kind.SOURCE_WRITE, LENGTH.pack(len(data)))
        self.progress()

    def by_rdma(self, nbytes: int) -> bool:
        return nbytes > self.conn.rdma_threshold

    def recv(self, nbytes: int, timeout: float = 10.0) -> bytes:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            raise TypeError(f"recv takes a byte count, got {nbytes!r:.80}")
        if nbytes < 0:
            raise ValueError(f"recv of a negative byte count {nbytes}")
        self.conn.run_until(lambda: self.ready() >= nbytes, timeout, f"{nbytes} bytes on {self.name}")
        out = bytes(self.stream[:nbytes])
        del self.stream[:nbytes]
        return out

    def ready(self) -> int:
        while self.arriving:
            head = self.arriving[0]
            if isinstance(head, Transfer):
                if head.data is None:
                    break
                self.stream += head.data
            else:
                self.stream += head
            self.arriving.popleft()
        return len(self.stream)

    def check(self) -> None:
        if self.closed:
            raise SanError(WsaError.WSAENOTSOCK, f"{self.name} is closed")
        if self.error:
            raise SanError(WsaError.WSAECONNRESET, f"{self.name}: {self.error}")

    def failed(self, what: str, status: Status) -> bool:
        if status is not Status.SUCCESS:
            self.error = self.error or f"{what} completed {status.name}"
        return self.error is not None

    # -- closing

    def releases(self) -> list[Release]:
        """R11: what close deregisters (how, and its key): every registration no pending operation of ours
        uses."""
        found: list[Release] = []
        if self.handles and all(op.done() for op in self.sends.values()):
            found.append((self.provider.deregister_memory, self.handles[0]))
        if len(self.handles) > 1 and all(op.done() for _, op in self.receives):
            found.append((self.provider.deregister_memory, self.handles[1]))
        for item in (*self.to_read, *self.to_sink, *self.writing, *self.sinks, *self.reading):
            if item.descriptor is not None:
                found.append((self.provider.deregister_rdma_memory, item.descriptor))
            if item.handle is not None and not item.busy():
                found.append((self.provider.deregister_memory, item.handle))
        return found

    def close(self) -> None:
        """Deregister what is idle, then close the socket (the provider releases the rest); every step is tried,
        the first failure raised afterwards."""
        if self.closed:
            return
        self.closed = True
        if self.socket.closed:
            return  # gone already (a process that died has its sockets closed): the provider released it
        failure: Exception | None = None
        for release, key in self.releases():
            try:
                self.call(release, key)
            except Exception as exc:
                failure = failure or exc
        self.call(self.provider.close_socket)
        if failure is not None:
            raise failure

    # -- progress

    def progress(self) -> bool:
        """Reap sends, take messages, move RDMA, send what flow control allows; whether anything moved. A closed or
        failed end moves nothing."""
        if self.closed or self.error:
            return False
        before = self.moves()
        self.step()
        return self.moves() != before

    def moves(self) -> tuple[int, ...]:
        """What changes whenever something moves: messages sent and taken, sends reaped, receives failed, RDMA
        finished."""
        return self.sent, self.taken, len(self.free), len(self.receives), len(self.reading), len(self.writing)

    def step(self) -> None:
        for index, op in list(self.sends.items()):
            if op.done():
                del self.sends[index]
                self.free.append(index)
                if self.failed("send", op.wait().status):
                    return
        while self.receives and self.receives[0][1].done():
            index, op = self.receives.popleft()
            done = op.wait()
            if self.failed("receive", done.status):
                return
            message = self.slot(self.recv_region, index).read(done.bytes)
            self.post_receive(index)
            self.taken += 1
            (self.peer_taken,) = HEADER.unpack_from(message)
            self.incoming += message[HEADER.size:]
            for kind, body in take_records(self.incoming):
                self.handle(kind, body)
        self.advance()
        self.flush()

    def handle(self, kind: Kind, body: bytes) -> None:
        if kind is Kind.DATA:
            self.arriving.append(body)
        elif kind in (Kind.SOURCE_READ, Kind.SOURCE_WRITE):
            (length,) = LENGTH.unpack_from(body)
            item = Transfer(self.process.alloc(length), length)
            self.arriving.append(item)
            if kind is Kind.SOURCE_READ:
                item.handle = self.call(self.provider.register_memory, item.buffer, Access.WRITE)
                item.ops = self.rdma(self.provider.rdma_read, item, body[LENGTH.size:])
                self.reading.append(item)
            else:
                item.descriptor = self.call(self.provider.register_rdma_memory, item.buffer, Access.WRITE)
                self.sinks.append(item)
                self.outgoing += record(Kind.SINK, bytes(item.descriptor))
        elif kind is Kind.SINK:
            out = self.to_sink.popleft()
            out.handle = self.call(self.provider.register_memory, out.buffer, Access.READ)
            out.ops = self.rdma(self.provider.rdma_write, out, body)
            self.writing.append(out)
        elif kind is Kind.READ_DONE:
            out = self.to_read.popleft()
            assert out.descriptor is not None  # exposed for the peer's RdmaRead: registered
            self.call(self.provider.deregister_rdma_memory, out.descriptor)
        elif kind is Kind.WRITE_DONE:
            item = self.sinks.popleft()
            assert item.descriptor is not None  # a sink offered is registered
            self.call(self.provider.deregister_rdma_memory, item.descriptor)
            item.data = item.buffer.read()

    def rdma(self, transfer: Callable[..., PendingOperation], item: Transfer,
             descriptor: bytes) -> list[PendingOperation]:
        """``transfer`` (rdma_read or rdma_write) over the whole of ``item``, in pieces of the provider's
        SO_MAX_RDMA_SIZE."""
        step = self.provider.getsockopt(self.socket, SO_MAX_RDMA_SIZE)
        return [self.call(transfer, [(item.buffer.view(at, min(step, item.length - at)), item.handle)], descriptor, at)
                for at in range(0, item.length, step)]

    def advance(self) -> None:
        """Finish the RDMA whose operations are all done: release its registration and tell the peer."""
        for queue, kind in ((self.reading, Kind.READ_DONE), (self.writing, Kind.WRITE_DONE)):
            while queue and not queue[0].busy():
                item = queue.popleft()
                for op in item.ops:
                    self.failed(kind.name.lower(), op.wait().status)
                if self.error:
                    return
                self.call(self.provider.deregister_memory, item.handle)
                if kind is Kind.READ_DONE:
                    item.data = item.buffer.read()
                self.outgoing += record(kind)

    def flush(self) -> None:
        """Send while there is something to say and flow control allows: the peer has room for ``message_count``
        of ours, minus those it has not said it took; the last of that room goes only to a message that says
        more than the last did, so two ends never both wait for the other to speak."""
        room = self.conn.message_size - HEADER.size
        while self.free and (self.outgoing or self.report_due()):
            credits = self.conn.message_count - (self.sent - self.peer_taken) % COUNT_MODULO
            if credits < 1 or (credits == 1 and self.taken == self.reported):
                return
            chunk = bytes(self.outgoing[:room])
            del self.outgoing[:room]
            index = self.free.popleft()
            self.reported = self.taken
            self.sent += 1
            self.sends[index] = self.send_message(index, HEADER.pack(self.taken % COUNT_MODULO) + chunk)

    def report_due(self) -> bool:
        """A message with nothing else in it is sent only to say what we took, once the peer could otherwise run
        out of room: ``message_count - 1`` messages taken since we last said (fewer would be legal too; a
        message that says nothing new is never due, so two ends never answer each other's reports forever)."""
        return (self.taken - self.reported) % COUNT_MODULO >= self.conn.message_count - 1

    def busy(self) -> bool:
        """Something of ours still waits to be sent or transferred (a sink offered waits for the peer's write)."""
        return bool(self.outgoing or self.to_read or self.to_sink or self.writing or self.reading or self.sinks)
