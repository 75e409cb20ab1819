"""One end of a switch connection: its two registered regions, credits and transfers in flight."""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Any, cast

from ..errors import SanError, WsaError
from ..protocols import Buffer, Call, Handle, Outcome, PendingOperation, Process, Provider, Proxy, Question, Socket
from ..together import Earlier, first_failure, together
from ..types import SO_MAX_RDMA_SIZE, Access, Status
from .session import HEADER, MORE, Kind, Message, messages, parse_src_avail, src_avail

if TYPE_CHECKING:
    from .connection import Connection


@dataclasses.dataclass
class _Incoming:
    """Received application data in stream order; a large transfer is ready once its RDMA is done."""

    data: bytes | None = None
    sink: Buffer | None = None
    length: int = 0
    handle: Handle | None = None  # read mode: the sink's register_memory handle
    descriptor: bytes | None = None  # write mode: the sink's RDMA descriptor
    ops: list[PendingOperation] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Outgoing:
    """A large send waiting for the peer: read mode holds a descriptor, write mode a handle and ops."""

    source: Buffer
    descriptor: bytes | None = None
    handle: Handle | None = None
    ops: list[PendingOperation] = dataclasses.field(default_factory=list)


class Endpoint:
    """A connected SAN socket driven by the switch. ``.socket .process .provider .proxy`` (CONTRACT.md section 5)."""

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
        self.send_handle: Handle | None = None
        self.recv_handle: Handle | None = None
        self.send_slots: list[Buffer] = []
        self.free_slots = collections.deque(range(count))
        self.sends: dict[int, PendingOperation] = {}  # slot -> send in flight
        self.recvs: collections.deque[tuple[int, PendingOperation]] = collections.deque()
        self.credits = count  # receives the peer has posted that we may consume
        self.to_return = 0  # receives we reposted that the peer does not know of yet
        # Of those, the ones that carried more than credits. Returning receives that credit-only messages
        # used as soon as ``threshold`` are due made two ends with a small window answer each other's
        # credit messages for ever: those wait until the peer may be stuck (it holds one credit or less).
        self.owed = 0
        self.outbox: collections.deque[Message] = collections.deque()
        self.partial = b""  # the payload so far of a message that goes on in the next (MORE)
        self.incoming: collections.deque[_Incoming] = collections.deque()
        self.stream = bytearray()
        self.reading: collections.deque[_Incoming] = collections.deque()  # read mode, sinks being read
        self.awaiting_read: collections.deque[_Outgoing] = collections.deque()  # read mode, sender side
        self.awaiting_sink: collections.deque[_Outgoing] = collections.deque()  # write mode, sender side
        self.writing: collections.deque[_Outgoing] = collections.deque()  # write mode, writes in flight

    # -- building (Connection.build: both ends' calls made together)

    def regions(self, first: int = 0) -> list[Call]:
        """R9: exactly two virtually contiguous regions, one per direction, and their registrations, each naming
        what its allocation returned (on a lab: one round trip for all four); ``first``: the index of these
        calls' first in the list they go in."""
        nbytes = self.conn.message_count * self.conn.message_size
        return [(self.process, "alloc", (nbytes,))] * 2 + [
            (self.provider, "register_memory", (self.socket, Earlier(first), Access.READ)),
            (self.provider, "register_memory", (self.socket, Earlier(first + 1), Access.WRITE))]

    def regions_made(self, outcomes: list[Outcome]) -> None:
        """What ``regions`` got: kept, so that ``abandon`` releases what succeeded."""
        regions, handles = outcomes[:2], outcomes[2:]
        self.conn.trace += [(self.name, "register_memory") for ok, _ in regions if ok]  # a failed one's is unmade
        (sent, send_handle), (received, recv_handle) = handles
        self.send_handle = send_handle if sent else None
        self.recv_handle = recv_handle if received else None
        if all(ok for ok, _ in regions):
            self.send_region, self.recv_region = (cast(Buffer, value) for _, value in regions)
            size = self.conn.message_size
            self.send_slots = [self.send_region.view(i * size, size) for i in range(self.conn.message_count)]

    def receives(self) -> list[Call]:
        """A receive posted in each slot of the receive region."""
        return [(self.provider, "recv", (self.socket, [(self._recv_slot(slot), self.recv_handle)]))
                for slot in range(self.conn.message_count)]

    def receives_made(self, outcomes: list[Outcome]) -> None:
        self.recvs.extend((slot, cast(PendingOperation, op)) for slot, (ok, op) in enumerate(outcomes) if ok)

    # -- provider calls, traced so a scenario can see what the switch asked for (R9, R10)

    def _call(self, method: str, *args: Any) -> Any:
        self.conn.trace.append((self.name, method))
        return getattr(self.provider, method)(self.socket, *args)

    def _room(self) -> int:
        """The payload one message holds."""
        return self.conn.message_size - HEADER.size

    def _recv_slot(self, slot: int) -> Buffer:
        size = self.conn.message_size
        return self.recv_region.view(slot * size, size)

    def _take(self, slot: int, nbytes: int) -> bytes:
        """The message in receive slot ``slot``, and a receive posted there again: together (on a lab: one round
        trip), the read first."""
        handle = self.recv_handle
        assert handle is not None
        size = self.conn.message_size
        (read, data), (posted, op) = together(self.conn.switch.backend, [
            (self.recv_region, "read", (nbytes, slot * size)),
            (self.provider, "recv", (self.socket, [(self._recv_slot(slot), handle)]))])
        if posted:
            self.recvs.append((slot, cast(PendingOperation, op)))
        raise_first([(read, data), (posted, op)])
        return cast(bytes, data)

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
            if self.conn.read_mode(self.peer):
                desc = self._call("register_rdma_memory", source, Access.READ)
                self.awaiting_read.append(_Outgoing(source, descriptor=desc))
                self.outbox.extend(src_avail(len(data), bytes(desc), self._room()))
            else:
                self.awaiting_sink.append(_Outgoing(source))
                self.outbox.extend(src_avail(len(data), b"", self._room()))
        else:
            chunk = self._room()
            for i in range(0, len(data), chunk):
                self.outbox.append(Message(Kind.DATA, bytes(data[i:i + chunk])))
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
        """R11: deregister every region no pending operation uses, then close the socket.

        Every release is attempted, and the socket closed, even when one of them fails; the first
        failure is raised afterwards.
        """
        if self.closed:
            return
        self.closed = True
        busy_recv = any(not op.done() for _, op in self.recvs)
        busy_send = any(not op.done() for op in self.sends.values())
        releases: list[tuple[str, Any]] = []
        if not busy_send and self.send_handle is not None:
            releases.append(("deregister_memory", self.send_handle))
        if not busy_recv and self.recv_handle is not None:
            releases.append(("deregister_memory", self.recv_handle))
        for item in self.incoming:
            if item.handle is not None and not any(not op.done() for op in item.ops):
                releases.append(("deregister_memory", item.handle))
            if item.descriptor is not None:
                releases.append(("deregister_rdma_memory", item.descriptor))
        for out in (*self.awaiting_read, *self.writing):
            if out.descriptor is not None:
                releases.append(("deregister_rdma_memory", out.descriptor))
            if out.handle is not None and not any(not op.done() for op in out.ops):
                releases.append(("deregister_memory", out.handle))
        if self.socket.closed or not self.process.alive:
            return  # the socket is already gone (the process died): the provider released it
        failure: Exception | None = None
        for method, key in releases:
            try:
                self._call(method, key)
            except Exception as exc:
                failure = failure or exc
        self._call("close_socket")
        if failure is not None:
            raise failure

    def abandon(self, failure: BaseException) -> None:
        """Release what this endpoint built (a connect failed); a failure to do so is noted on ``failure``."""
        try:
            self.close()
        except Exception as exc:
            add_note(failure, f"while releasing the half-built {self.name} endpoint: {exc!r}")

    # -- progress

    def _ready(self) -> int:
        while self.incoming and self.incoming[0].data is not None:
            data = self.incoming.popleft().data
            assert data is not None
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

    def questions(self) -> list[Question]:
        """What ``progress`` asks of the operations in flight: whether each is done."""
        if self.closed or self.error:
            return []
        ops = [*self.sends.values(), *(op for _, op in self.recvs)]
        ops += [op for item in self.reading for op in item.ops] + [op for out in self.writing for op in out.ops]
        return [(op, "done", ()) for op in ops]

    def progress(self) -> bool:
        """Reap completions, handle messages, start what credits allow; True if anything moved."""
        if self.closed or self.error:
            return False
        moved = self._reap_sends()
        while self.recvs and self.recvs[0][1].done():
            slot, op = self.recvs.popleft()
            done = op.wait(0)
            if self._failed("receive", done.status):
                return True
            msg = Message.decode(self._take(slot, done.bytes))
            self.to_return += 1
            if msg.kind is not Kind.CREDIT:
                self.owed += 1
            self.credits += msg.credits
            moved = True
            if msg.flags & MORE:  # a payload longer than one message: the rest follows
                self.partial += msg.payload
                continue
            if self.partial:
                msg = Message(msg.kind, self.partial + msg.payload, msg.credits)
                self.partial = b""
            self._handle(msg)
        moved = self._advance_rdma() or moved
        return self._flush() or moved

    def _reap_sends(self) -> bool:
        moved = False
        for slot, op in list(self.sends.items()):
            if op.done():
                del self.sends[slot]
                self.free_slots.append(slot)
                self._failed("send", op.wait(0).status)
                moved = True
        return moved

    def _handle(self, msg: Message) -> None:
        if msg.kind is Kind.DATA:
            self.incoming.append(_Incoming(data=msg.payload))
        elif msg.kind is Kind.SRC_AVAIL:
            length, desc = parse_src_avail(msg)
            sink = self.process.alloc(length)
            item = _Incoming(sink=sink, length=length)
            self.incoming.append(item)
            if desc:  # read mode: pull the bytes from the sender's READ descriptor
                item.handle = self._call("register_memory", sink, Access.WRITE)
                self._rdma_chunks(item.ops, "rdma_read", sink, item.handle, desc)
                self.reading.append(item)
            else:  # write mode: let the sender write into a WRITE descriptor
                item.descriptor = self._call("register_rdma_memory", sink, Access.WRITE)
                self.outbox.extend(messages(Kind.SINK_AVAIL, bytes(item.descriptor), self._room()))
        elif msg.kind is Kind.SINK_AVAIL:
            out = self.awaiting_sink.popleft()
            out.handle = self._call("register_memory", out.source, Access.READ)
            self._rdma_chunks(out.ops, "rdma_write", out.source, out.handle, msg.payload)
            self.writing.append(out)
        elif msg.kind is Kind.RD_COMPL:
            out = self.awaiting_read.popleft()
            assert out.descriptor is not None
            self._call("deregister_rdma_memory", out.descriptor)
        elif msg.kind is Kind.WR_COMPL:
            item = next(i for i in self.incoming if i.descriptor is not None)
            assert item.descriptor is not None and item.sink is not None
            self._call("deregister_rdma_memory", item.descriptor)
            item.descriptor = None
            item.data = item.sink.read(item.length)

    def _rdma_chunks(self, ops: list[PendingOperation], method: str, local: Buffer, handle: Handle,
                     descriptor: bytes) -> None:
        step = self.provider.getsockopt(self.socket, SO_MAX_RDMA_SIZE)
        for offset in range(0, local.length, step):
            part = local.view(offset, min(step, local.length - offset))
            ops.append(self._call(method, [(part, handle)], descriptor, offset))

    def _advance_rdma(self) -> bool:
        moved = False
        while self.reading and all(op.done() for op in self.reading[0].ops):
            item = self.reading.popleft()
            for op in item.ops:
                self._failed("RDMA read", op.wait(0).status)
            if self.error:
                return True
            assert item.handle is not None and item.sink is not None
            self._call("deregister_memory", item.handle)
            item.handle = None
            item.data = item.sink.read(item.length)
            self.outbox.append(Message(Kind.RD_COMPL))
            moved = True
        while self.writing and all(op.done() for op in self.writing[0].ops):
            out = self.writing.popleft()
            for op in out.ops:
                self._failed("RDMA write", op.wait(0).status)
            if self.error:
                return True
            assert out.handle is not None
            self._call("deregister_memory", out.handle)
            self.outbox.append(Message(Kind.WR_COMPL))
            moved = True
        return moved

    def _flush(self) -> bool:
        moved = False
        threshold = max(1, self.conn.message_count // 2)
        if (self.owed >= threshold or self.to_return >= self.conn.message_count - 1) and not self.outbox:
            self.outbox.append(Message(Kind.CREDIT))
        while self.outbox and self.free_slots:
            # The last credit goes only to a message that returns credits (every message returns all that are
            # due): an end that spends its last one has given the peer at least one, so the two ends are never
            # both left without credits, each waiting for the other's, however late completions show.
            if self.credits < 1 or (self.credits == 1 and not self.to_return):
                break
            msg = self.outbox.popleft()
            slot = self.free_slots.popleft()
            raw = msg.encode(self.to_return)
            self.to_return = self.owed = 0
            self.credits -= 1
            buf = self.send_slots[slot]
            handle = self.send_handle
            assert handle is not None
            # The message into its slot, then the send: together (on a lab: one round trip), in that order.
            (wrote, error), (sent, op) = together(self.conn.switch.backend, [
                (buf, "write", (raw,)), (self.provider, "send", (self.socket, [(buf.view(0, len(raw)), handle)]))])
            if sent:
                self.sends[slot] = cast(PendingOperation, op)
            raise_first([(wrote, error), (sent, op)])
            moved = True
        return moved

    def idle(self) -> bool:
        """Nothing of ours is waiting to be sent or transferred."""
        return not (self.outbox or self.awaiting_read or self.awaiting_sink or self.writing or self.reading)


def raise_first(outcomes: list[Outcome]) -> None:
    failure = first_failure(outcomes)
    if failure is not None:
        raise failure


def add_note(failure: BaseException, note: str) -> None:
    """``failure.add_note(note)`` where Python has it (3.11+)."""
    add = getattr(failure, "add_note", None)
    if add is not None:
        add(note)


def check_timeout(timeout: object) -> None:
    """A timeout is a number of seconds (not a bool, not NaN)."""
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError(f"timeout is a number of seconds, got {timeout!r:.80}")
    if timeout != timeout:
        raise ValueError("timeout is NaN")
