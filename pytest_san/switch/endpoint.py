"""One end of a switch connection: its two registered regions, credits and transfers in flight."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ..batch import Batch, Later, batch, raise_first
from ..notes import add_note
from ..spi.contract import SO_MAX_RDMA_SIZE, Access, SanError, Status, WsaError
from ..spi.protocols import Buffer, Handle, PendingOperation, Process, Provider, Proxy, Socket
from .session import HEADER, LENGTH, MORE, Kind, Message, messages, src_avail

if TYPE_CHECKING:
    from .connection import Connection

P = ParamSpec("P")
R = TypeVar("R")
Release = Callable[[Socket, Any], None]
"""A provider's deregistration, bound: ``deregister_memory`` or ``deregister_rdma_memory``."""

__all__ = ["Endpoint", "Regions", "add_note", "check_timeout"]

Regions = tuple[Later[Buffer], Later[Buffer], Later[Handle], Later[Handle]]
"""An end's two regions and their registrations (send, receive), as a batch makes them."""


@dataclasses.dataclass
class _Incoming:
    """Received application data in stream order; a large transfer's is ready once its RDMA is done."""

    data: bytes | None = None
    sink: Buffer | None = None  # a large transfer's: where RDMA puts the bytes
    handle: Handle | None = None  # read mode: the sink's register_memory handle
    descriptor: bytes | None = None  # write mode: the sink's RDMA descriptor
    ops: list[PendingOperation] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Outgoing:
    """A large send in write mode: waiting for the peer's WRITE descriptor, then written."""

    source: Buffer
    handle: Handle | None = None
    ops: list[PendingOperation] = dataclasses.field(default_factory=list)


class Endpoint:
    """A connected SAN socket driven by pytest-san's own switch. ``.socket .process .provider .proxy`` (CONTRACT.md
    section 5). ``pytest_san.Endpoint``; the protocol of any switch's is ``pytest_san.protocols.SwitchEndpoint``."""

    send_handle: Handle | None = None  # the regions' registrations: none until ``regions_made``
    recv_handle: Handle | None = None

    def __init__(self, conn: Connection, name: str, socket: Socket, process: Process) -> None:
        self.conn = conn
        self.name = name
        self.socket = socket
        self.process = process
        self.provider: Provider = process.node.provider
        self.proxy: Proxy = process.node.proxy
        self.peer: Endpoint
        self.closed = False
        self.error: str | None = None
        count = conn.message_count
        self.send_region: Buffer  # these three once ``regions_made`` has both regions
        self.recv_region: Buffer
        self.send_slots: list[Buffer]
        self.free_slots = collections.deque(range(count))
        self.sends: dict[int, PendingOperation] = {}  # slot -> send in flight
        self.recvs: collections.deque[tuple[int, PendingOperation]] = collections.deque()
        self.credits = count  # receives the peer has posted that we may consume
        self.to_return = 0  # receives we reposted that the peer does not know of yet
        self.outbox: collections.deque[Message] = collections.deque()
        self.partial = b""  # the payload so far of a message that goes on in the next (MORE)
        self.incoming: collections.deque[_Incoming] = collections.deque()
        self.stream = bytearray()
        self.reading: collections.deque[_Incoming] = collections.deque()  # read mode, sinks being read
        self.offered: collections.deque[_Incoming] = collections.deque()  # write mode, sinks being written
        self.awaiting_read: collections.deque[bytes] = collections.deque()  # read mode: our sources' descriptors
        self.awaiting_sink: collections.deque[_Outgoing] = collections.deque()  # write mode, sender side
        self.writing: collections.deque[_Outgoing] = collections.deque()  # write mode, writes in flight
        self.answered: dict[int, bool] = {}  # during ``progress``: whether each operation asked ahead was done

    # -- building (Connection.build: both ends' calls made together)

    def regions(self, b: Batch) -> Regions:
        """R9: exactly two virtually contiguous regions, one per direction, and their registrations, each naming
        what its allocation returned (on a lab: one round trip for all four)."""
        nbytes = self.conn.message_count * self.conn.message_size
        send, recv = b.call(self.process.alloc, nbytes), b.call(self.process.alloc, nbytes)
        return (send, recv, b.call(self.provider.register_memory, self.socket, send.ref, Access.READ),
                b.call(self.provider.register_memory, self.socket, recv.ref, Access.WRITE))

    def regions_made(self, made: Regions) -> None:
        """What ``regions`` got: kept, so that ``abandon`` releases what succeeded."""
        send, recv, send_handle, recv_handle = made
        # A registration is asked for once its region is allocated (one naming a failed allocation is unmade).
        self.conn.trace += [(self.name, "register_memory") for region in (send, recv) if region.error is None]
        self.send_handle, self.recv_handle = (h.value if h.error is None else None for h in (send_handle, recv_handle))
        if send.error is None and recv.error is None:
            self.send_region, self.recv_region = send.value, recv.value
            size = self.conn.message_size
            self.send_slots = [self.send_region.view(i * size, size) for i in range(self.conn.message_count)]

    def receives(self, b: Batch) -> list[Later[PendingOperation]]:
        """A receive posted in each slot of the receive region."""
        return [b.call(self.provider.recv, self.socket, [(self._recv_slot(slot), self.recv_handle)])
                for slot in range(self.conn.message_count)]

    def receives_made(self, posted: list[Later[PendingOperation]]) -> None:
        self.recvs.extend((slot, op.value) for slot, op in enumerate(posted) if op.error is None)

    # -- provider calls, traced so a scenario can see what the switch asked for (R9, R10)

    def _call(self, fn: Callable[Concatenate[Socket, P], R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(self.socket, ...)``: one of this end's provider's methods, traced by its name."""
        self.conn.trace.append((self.name, fn.__name__))
        return fn(self.socket, *args, **kwargs)

    def _batch(self) -> Batch:
        """A message slot's read or write and the send or receive on it: made together (on a lab: one round
        trip)."""
        return batch(self.conn.switch.backend)

    def _room(self) -> int:
        """The payload one message holds."""
        return self.conn.message_size - HEADER.size

    def _recv_slot(self, slot: int) -> Buffer:
        size = self.conn.message_size
        return self.recv_region.view(slot * size, size)

    def _take(self, slot: int) -> bytes:
        """The message in receive slot ``slot``, and a receive posted there again: the read first."""
        view = self._recv_slot(slot)
        self.conn.trace.append((self.name, "recv"))
        with self._batch() as b:
            read = b.call(view.read)
            posted = b.call(self.provider.recv, self.socket, [(view, self.recv_handle)])
        if posted.error is None:
            self.recvs.append((slot, posted.value))
        raise_first([read, posted])
        return read.value

    # -- the application's side

    def send(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` for the peer: inline messages, or RDMA above the threshold (R10)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"send takes bytes, got {data!r:.80}")
        data = bytes(data)  # the same object when it is bytes already
        self._check()
        if len(data) > self.conn.rdma_threshold:
            source = self.process.alloc(len(data))
            source.write(data)
            desc = b""  # write mode: the peer offers a WRITE descriptor for it
            if self.conn.read_mode(self.peer):
                desc = bytes(self._call(self.provider.register_rdma_memory, source, Access.READ))
                self.awaiting_read.append(desc)
            else:
                self.awaiting_sink.append(_Outgoing(source))
            self.outbox.extend(src_avail(len(data), desc, self._room()))
        else:
            self.outbox.extend(messages(Kind.DATA, data, self._room()))
        # Only our own side moves now; the peer's switch acts when its application calls recv.
        self.progress()

    def recv(self, nbytes: int, timeout: float = 10.0) -> bytes:
        """Exactly ``nbytes`` of the peer's data, in order."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            raise TypeError(f"recv takes a byte count, got {nbytes!r:.80}")
        if nbytes < 0:
            raise ValueError(f"recv of a negative byte count {nbytes}")
        check_timeout(timeout)
        self.conn.run_until(lambda: self._ready() >= nbytes, timeout, f"{nbytes} bytes on {self.name}")
        out = bytes(self.stream[:nbytes])
        del self.stream[:nbytes]
        return out

    def close(self) -> None:
        """R11: deregister every region no pending operation uses, then close the socket (also when a
        deregistration fails: the provider releases the rest, and the first failure is raised)."""
        if self.closed:
            return
        self.closed = True
        if self.socket.closed or not self.process.alive:
            return  # the socket is already gone (the process died): the provider released it
        try:
            for release, key, ops in self._registered():
                if key is not None and all(op.done() for op in ops):
                    self._call(release, key)
        finally:
            self._call(self.provider.close_socket)

    def abandon(self, failure: BaseException) -> None:
        """Release what this endpoint built (a connect failed); a failure to do so is noted on ``failure``."""
        try:
            self.close()
        except Exception as exc:
            add_note(failure, f"while releasing the half-built {self.name} endpoint: {exc!r}")

    def _registered(self) -> Iterator[tuple[Release, Handle | None, Iterable[PendingOperation]]]:
        """Everything the switch registered on the socket and holds: how it is deregistered, its key, and the
        operations that use it."""
        memory, rdma_memory = self.provider.deregister_memory, self.provider.deregister_rdma_memory
        yield memory, self.send_handle, self.sends.values()
        yield memory, self.recv_handle, (op for _, op in self.recvs)
        for item in self.reading:
            yield memory, item.handle, item.ops
        for out in self.writing:
            yield memory, out.handle, out.ops
        for item in self.offered:
            yield rdma_memory, item.descriptor, ()
        for desc in self.awaiting_read:
            yield rdma_memory, desc, ()

    # -- progress

    def _ready(self) -> int:
        while self.incoming:
            data = self.incoming[0].data
            if data is None:  # not arrived yet: what follows waits behind it
                break
            self.incoming.popleft()
            self.stream += data
        return len(self.stream)

    def _check(self) -> None:
        if self.closed:
            raise SanError(WsaError.WSAENOTSOCK, f"{self.name} is closed")
        if self.error:
            raise SanError(WsaError.WSAECONNRESET, f"{self.name}: {self.error}")

    def _failed(self, what: str, status: Status) -> bool:
        if status is Status.SUCCESS:
            return False
        self.error = self.error or f"{what} completed {status.name}"
        return True

    def _finished(self, ops: list[PendingOperation]) -> bool:
        """Every one of a large transfer's ``ops`` done and succeeded (one that failed puts the endpoint in
        error)."""
        return all(self._done(op) for op in ops) and not any(self._failed("RDMA", op.wait().status) for op in ops)

    def in_flight(self) -> list[PendingOperation]:
        """The operations in flight, whose being done ``progress`` asks: a caller may ask them ahead."""
        return [op for _, _, ops in self._registered() for op in ops]

    def _done(self, op: PendingOperation) -> bool:
        """Whether ``op`` is done: as asked ahead (``progress(answered)``), else asked now."""
        answer = self.answered.get(id(op))
        return op.done() if answer is None else answer

    def progress(self, answered: dict[int, bool] | None = None) -> bool:
        """Reap completions, handle messages, start what credits allow; True if it made a provider call (then
        more may be possible at once). ``answered``: whether each operation asked ahead (by ``id``) was done."""
        before = len(self.conn.trace)
        self.answered = answered or {}
        try:
            for step in (self._reap_sends, self._receive, self._advance_rdma, self._flush):
                if self.closed or self.error:
                    break
                step()
        finally:
            self.answered = {}
        return len(self.conn.trace) > before

    def _reap_sends(self) -> None:
        for slot, op in list(self.sends.items()):
            if self._done(op):
                del self.sends[slot]
                self.free_slots.append(slot)
                self._failed("send", op.wait().status)

    def _receive(self) -> None:
        while self.recvs and self._done(self.recvs[0][1]):
            slot, op = self.recvs.popleft()
            if self._failed("receive", op.wait().status):
                return
            msg = Message.decode(self._take(slot))
            self.to_return += 1
            self.credits += msg.credits
            self.partial += msg.payload
            if not msg.flags & MORE:  # else a payload longer than one message: the rest follows
                self._handle(msg.kind, self.partial)
                self.partial = b""

    def _handle(self, kind: Kind, payload: bytes) -> None:
        if kind is Kind.DATA:
            self.incoming.append(_Incoming(data=payload))
        elif kind is Kind.SRC_AVAIL:
            length, desc = LENGTH.unpack_from(payload)[0], payload[LENGTH.size:]
            sink = self.process.alloc(length)
            item = _Incoming(sink=sink)
            self.incoming.append(item)
            if desc:  # read mode: pull the bytes from the sender's READ descriptor
                item.handle = self._call(self.provider.register_memory, sink, Access.WRITE)
                self._rdma_chunks(item.ops, self.provider.rdma_read, sink, item.handle, desc)
                self.reading.append(item)
            else:  # write mode: let the sender write into a WRITE descriptor
                item.descriptor = bytes(self._call(self.provider.register_rdma_memory, sink, Access.WRITE))
                self.offered.append(item)
                self.outbox.extend(messages(Kind.SINK_AVAIL, item.descriptor, self._room()))
        elif kind is Kind.SINK_AVAIL:
            out = self.awaiting_sink.popleft()
            out.handle = self._call(self.provider.register_memory, out.source, Access.READ)
            self._rdma_chunks(out.ops, self.provider.rdma_write, out.source, out.handle, payload)
            self.writing.append(out)
        elif kind is Kind.RD_COMPL:
            self._call(self.provider.deregister_rdma_memory, self.awaiting_read.popleft())
        elif kind is Kind.WR_COMPL:
            item = self.offered.popleft()
            assert item.descriptor is not None  # an offered sink is registered (SINK_AVAIL carried it)
            self._call(self.provider.deregister_rdma_memory, item.descriptor)
            item.data = _read(item.sink)

    def _rdma_chunks(self, ops: list[PendingOperation], transfer: Callable[..., PendingOperation], local: Buffer,
                     handle: Handle, descriptor: bytes) -> None:
        step = self.provider.getsockopt(self.socket, SO_MAX_RDMA_SIZE)
        for offset in range(0, local.length, step):
            part = local.view(offset, min(step, local.length - offset))
            ops.append(self._call(transfer, [(part, handle)], descriptor, offset))

    def _advance_rdma(self) -> None:
        while self.reading and self._finished(self.reading[0].ops):
            item = self.reading.popleft()
            self._call(self.provider.deregister_memory, item.handle)
            item.data = _read(item.sink)
            self.outbox.append(Message(Kind.RD_COMPL))
        while self.writing and self._finished(self.writing[0].ops):
            self._call(self.provider.deregister_memory, self.writing.popleft().handle)
            self.outbox.append(Message(Kind.WR_COMPL))

    def _flush(self) -> None:
        # Credits go back with every message; alone only once the peer may be stuck (it holds one credit or
        # less). Returning each as soon as it is due would make two ends answer each other's credit messages
        # for ever (a credit message uses a receive too).
        if self.to_return >= self.conn.message_count - 1 and not self.outbox:
            self.outbox.append(Message(Kind.CREDIT))
        # The last credit goes only to a message that returns credits (every message returns all that are due):
        # an end that spends its last one has given the peer at least one, so the two ends are never both left
        # without credits, each waiting for the other's, however late completions show.
        while self.outbox and self.free_slots and self.credits > (0 if self.to_return else 1):
            msg = self.outbox.popleft()
            slot = self.free_slots.popleft()
            raw = msg.encode(self.to_return)
            self.to_return = 0
            self.credits -= 1
            buf = self.send_slots[slot]
            self.conn.trace.append((self.name, "send"))
            with self._batch() as b:
                wrote = b.call(buf.write, raw)
                sent = b.call(self.provider.send, self.socket, [(buf.view(0, len(raw)), self.send_handle)])
            if sent.error is None:
                self.sends[slot] = sent.value
            raise_first([wrote, sent])

    def idle(self) -> bool:
        """Nothing of ours is waiting to be sent or transferred (a sink we offered: until it is written)."""
        return not any((self.outbox, self.awaiting_read, self.awaiting_sink, self.writing, self.reading, self.offered))


def _read(sink: Buffer | None) -> bytes:
    """All of a large transfer's sink."""
    assert sink is not None
    return sink.read()


def check_timeout(timeout: object) -> None:
    """A timeout is a number of seconds (not a bool, not NaN)."""
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError(f"timeout is a number of seconds, got {timeout!r:.80}")
    if timeout != timeout:
        raise ValueError("timeout is NaN")
