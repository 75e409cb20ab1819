"""Helpers the scenarios share: guarded buffers and "was it rejected?" checks, all on the public API."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pytest

from pytest_san import (
    PAGE_SIZE,
    Access,
    Backend,
    Buffer,
    Completion,
    Handle,
    PendingOperation,
    Process,
    Provider,
    Proxy,
    SanError,
    Socket,
    Status,
    WsaError,
)
from pytest_san.batch import batch, is_alive, is_closed, values
from pytest_san.spi.protocols import Faults, Node

GUARD = 64
GUARD_BYTE = 0xA5
TIMEOUT = 30.0  # Soft-RoCE under TCG is slow: be generous, the emulator never waits this long


class End(Protocol):
    """One end of a connection: a switch Endpoint or a RawEnd."""

    @property
    def socket(self) -> Socket: ...
    @property
    def process(self) -> Process: ...
    @property
    def provider(self) -> Provider: ...
    @property
    def proxy(self) -> Proxy: ...


@dataclasses.dataclass
class Guarded:
    """A buffer with guard bytes either side of ``inner``; the guards must never change."""

    whole: Buffer
    inner: Buffer
    fill: int

    def intact(self) -> bool:
        data = self.whole.read()
        n = self.inner.length
        return data[:GUARD] == bytes([GUARD_BYTE]) * GUARD and data[GUARD + n:] == bytes([GUARD_BYTE]) * GUARD

    def unchanged(self) -> bool:
        """Guards intact and the inner bytes still the fill pattern."""
        return self.intact() and self.inner.read() == bytes([self.fill]) * self.inner.length


def page_apart(endpoint: End, start: int, length: int) -> tuple[Buffer, int]:
    """(an allocation, where in it) ``length`` bytes lie ``start`` bytes into a page, with a whole page of the
    allocation before that page and one or more after the last: no other allocation shares a page with them."""
    whole = endpoint.process.alloc(start + length + 3 * PAGE_SIZE)
    return whole, -whole.address % PAGE_SIZE + PAGE_SIZE + start


def guarded(endpoint: End, nbytes: int, fill: int = 0x00) -> Guarded:
    whole = endpoint.process.alloc(nbytes + 2 * GUARD)
    whole.write(bytes([GUARD_BYTE]) * GUARD + bytes([fill]) * nbytes + bytes([GUARD_BYTE]) * GUARD)
    return Guarded(whole, whole.view(GUARD, nbytes), fill)


def source(endpoint: End, data: bytes, access: Access = Access.READ) -> tuple[Buffer, Handle]:
    """A registered local buffer holding ``data``: a valid RDMA write source or send buffer."""
    buf = endpoint.process.alloc(len(data))
    buf.write(data)
    return buf, endpoint.provider.register_memory(endpoint.socket, buf, access)


def sources(backend: object, endpoint: End, payloads: Sequence[bytes],
            access: Access = Access.READ) -> list[tuple[Buffer, Handle]]:
    """``source`` of each payload: the allocations, then the writes and the registrations, each batch made
    together where ``backend`` can (a lab: two round trips in all); the first failure is raised."""
    with batch(backend) as b:
        allocs = [b.call(endpoint.process.alloc, len(data)) for data in payloads]
    bufs = values(allocs)
    with batch(backend) as b:
        writes = [b.call(buf.write, data) for buf, data in zip(bufs, payloads, strict=True)]
        registered = [b.call(endpoint.provider.register_memory, endpoint.socket, buf, access) for buf in bufs]
    values(writes)
    return list(zip(bufs, values(registered), strict=True))


def sink(endpoint: End, nbytes: int, access: Access = Access.WRITE) -> tuple[Guarded, Handle]:
    """A registered local buffer (with guards) to receive into."""
    g = guarded(endpoint, nbytes, fill=0x11)
    return g, endpoint.provider.register_memory(endpoint.socket, g.inner, access)


def window(endpoint: End, nbytes: int, access: Access, fill: int = 0x22) -> tuple[Guarded, bytes]:
    """A guarded buffer registered for RDMA by ``endpoint``: (guarded buffer, descriptor)."""
    g = guarded(endpoint, nbytes, fill)
    return g, endpoint.provider.register_rdma_memory(endpoint.socket, g.inner, access)


Outcome = Completion | SanError

NEEDS_READ = pytest.mark.san_requires("rdma_read")
"""RdmaRead is optional (CONTRACT.md section 2): a scenario that calls it declares so."""
RDMA_KINDS = ["rdma_write", pytest.param("rdma_read", marks=NEEDS_READ)]
"""Parametrize over both RDMA directions; the read one is skipped on nodes without RdmaRead."""


def fail_allocations(faults: Faults, node: Node, count: int, after: int) -> None:
    """``faults.fail_allocations(node, count, after=after)``; a Faults written before ``after`` (``after`` came
    later, and is optional) skips the test where ``after`` is asked for, and takes the old call where it is 0."""
    if not after:
        faults.fail_allocations(node, count)
        return
    try:
        faults.fail_allocations(node, count, after=after)
    except TypeError:
        pytest.skip("this backend's Faults.fail_allocations takes no `after`")


def expect_error(code: WsaError, call: Callable[..., object], *args: Any) -> SanError:
    """The SanError ``call(*args)`` must raise, with ``code``."""
    with pytest.raises(SanError) as info:
        call(*args)
    assert info.value.code is code, f"expected {code.name}, got {info.value}"
    return info.value


def attempt(call: Callable[[], PendingOperation]) -> Outcome:
    """Run a provider call: a SanError, or the completion of the operation it started."""
    try:
        result = call()
    except SanError as exc:
        return exc
    return result.wait(timeout=TIMEOUT)


def rejected(outcome: Outcome) -> bool:
    return isinstance(outcome, SanError) or outcome.status is not Status.SUCCESS


def succeeded(outcome: Outcome, nbytes: int) -> bool:
    return isinstance(outcome, Completion) and outcome.status is Status.SUCCESS and outcome.bytes == nbytes


def write_into(initiator: End, descriptor: bytes, data: bytes, offset: int = 0) -> Outcome:
    """RDMA-write ``data`` from a fresh registered source of ``initiator`` into ``descriptor``."""
    buf, handle = source(initiator, data)
    return attempt(lambda: initiator.provider.rdma_write(initiator.socket, [(buf, handle)], descriptor, offset))


def read_from(initiator: End, descriptor: bytes, nbytes: int, offset: int = 0) -> tuple[Outcome, Guarded]:
    """RDMA-read ``nbytes`` from ``descriptor`` into a fresh registered sink of ``initiator``."""
    g, handle = sink(initiator, nbytes)
    return attempt(lambda: initiator.provider.rdma_read(initiator.socket, [(g.inner, handle)], descriptor,
                                                         offset)), g


def receive(sender: End, receiver: End, buffers: list[tuple[Buffer, Handle]], data: bytes) -> Outcome:
    """A receive into ``buffers`` posted by ``receiver``, and ``data`` sent by ``sender`` only if the receive is
    still pending (a provider may refuse a bad sink at the call, at once, or only when data arrives). The
    receive's outcome; the send's is not looked at (it may fail either way). No other receive may be posted."""
    try:
        recv = receiver.provider.recv(receiver.socket, buffers)
    except SanError as exc:
        return exc
    if not recv.done():
        try:  # the receive may have failed by now, and broken the connection: the send may be refused
            buf, handle = source(sender, data)
            attempt(lambda: sender.provider.send(sender.socket, [(buf, handle)]))
        except SanError:
            pass
    return recv.wait(timeout=TIMEOUT)


@dataclasses.dataclass
class RawEnd:
    """One end of a socket pair made without the switch (no message regions, no posted receives)."""

    socket: Any
    process: Any
    provider: Any
    proxy: Any

    def close(self) -> None:
        if not self.socket.closed and self.process.alive:
            self.provider.close_socket(self.socket)


@contextlib.contextmanager
def fresh_pair(backend: Backend, a: Process, b: Process) -> Iterator[tuple[RawEnd, RawEnd]]:
    """A connected socket pair between ``a`` and ``b`` made without the switch, closed when the block ends (a
    rejected transfer may break a connection: each shape of a property gets its own)."""
    sa, sb = backend.connect_sockets(a, b)
    ends = (RawEnd(sa, a, a.node.provider, a.node.proxy), RawEnd(sb, b, b.node.provider, b.node.proxy))
    try:
        yield ends
    finally:
        close_ends(backend, ends)


def two_processes(backend: Backend) -> tuple[Process, Process]:
    """The default processes of the first two nodes (of the first alone when there is one), as ``raw_pair``."""
    nodes = backend.nodes
    return nodes[0].default_process, nodes[min(1, len(nodes) - 1)].default_process


def close_ends(backend: Backend, ends: Sequence[RawEnd]) -> None:
    """Close those of ``ends`` still open whose process lives (asked together: on a lab one round trip)."""
    with batch(backend) as b:
        states = [(end, b.call(is_closed, end.socket), b.call(is_alive, end.process)) for end in ends]
    left = [end for end, closed, alive in states if not closed.value and alive.value]
    for end in left:
        end.provider.close_socket(end.socket)


# -- scatter lists: several entries, one of them bad ------------------------------------------------

MAX_SGE = 4
"""The most scatter entries a list may have (CONTRACT.md section 4, the reference order's ``list.count``). A
provider that takes fewer refuses a longer list with WSAEINVAL: a rejection, as the scenarios below count it."""

SOURCE_KINDS = ("send", "rdma_write")
"""Calls whose local list is read (its entries need READ); a receive's or an RDMA read's is written (WRITE)."""
SCATTER_GUARD = 8
"""Guard bytes around each entry of a ``Scatter``: a transfer one byte outside an entry reaches into them."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One scatter list: the entries' lengths, their access (each its own registration), which entry is bad, and
    for a range fault on which side it reaches one byte outside its registration."""

    lengths: tuple[int, ...]
    accesses: tuple[Access, ...]
    bad: int
    side: str = "after"  # "before" the start or "after" the end

    def __str__(self) -> str:
        where = "first" if self.bad == 0 else "last" if self.bad == len(self.lengths) - 1 else "middle"
        access = "/".join(a.name or str(int(a)) for a in self.accesses)
        return (f"{len(self.lengths)} entries of {list(self.lengths)} bytes ({access}), "
                f"the bad one #{self.bad} ({where}), {self.side}")


def scatter_shapes(scenario: str, kind: str, count: int = 2) -> list[Shape]:
    """The bad entry first, in the middle and last of a list of ``MAX_SGE``, then ``count`` more (any length from
    1 to MAX_SGE, any position) drawn from a seed named for the scenario and the call: a deterministic sample, the
    same on every run and every host."""
    rng = random.Random(zlib.crc32(f"{scenario}/{kind}".encode()))
    good = (Access.READ, Access.READWRITE) if kind in SOURCE_KINDS else (Access.WRITE, Access.READWRITE)

    def draw(n: int, bad: int) -> Shape:
        return Shape(tuple(rng.randint(1, 48) for _ in range(n)), tuple(rng.choice(good) for _ in range(n)), bad,
                     rng.choice(("before", "after")))

    fixed = [draw(MAX_SGE, bad) for bad in (0, MAX_SGE // 2, MAX_SGE - 1)]
    drawn = []
    for _ in range(count):
        n = rng.randint(1, MAX_SGE)
        drawn.append(draw(n, rng.randrange(n)))
    return fixed + drawn


@dataclasses.dataclass
class Scatter:
    """Entries laid out in one allocation, ``SCATTER_GUARD`` guard bytes around each, each registered alone."""

    whole: Buffer
    at: list[int]  # where each entry starts in ``whole``
    lengths: list[int]
    handles: list[Handle]
    image: bytes  # what ``whole`` holds while no byte has moved

    def entry(self, i: int, before: int = 0, after: int = 0) -> Buffer:
        """Entry ``i``'s range, reaching ``before`` bytes earlier and ``after`` bytes later (into its guards)."""
        return self.whole.view(self.at[i] - before, self.lengths[i] + before + after)

    def unchanged(self) -> bool:
        return self.whole.read() == self.image


def lay_out(backend: object, end: End, lengths: Sequence[int], accesses: Sequence[Access],
            fills: Sequence[int]) -> Scatter:
    """A ``Scatter`` of ``end``: entry ``i`` of ``lengths[i]`` bytes of ``fills[i]``, registered with
    ``accesses[i]`` (the registrations made together: on a lab one round trip)."""
    image = bytearray([GUARD_BYTE]) * SCATTER_GUARD
    at = []
    for length, fill in zip(lengths, fills, strict=True):
        at.append(len(image))
        image += bytes([fill]) * length + bytes([GUARD_BYTE]) * SCATTER_GUARD
    whole = end.process.alloc(len(image))
    whole.write(bytes(image))
    with batch(backend) as b:
        registered = [b.call(end.provider.register_memory, end.socket, whole.view(offset, length), access)
                      for offset, length, access in zip(at, lengths, accesses, strict=True)]
    handles = values(registered)
    return Scatter(whole, at, list(lengths), handles, bytes(image))


def transfer_is_rejected(backend: object, a: End, b: End, kind: str, entries: list[tuple[Buffer, Handle]],
                         local: Callable[[], bool], what: str) -> None:
    """``a`` makes a ``kind`` with ``entries`` as its local list, toward a peer target (``b``'s window or posted
    receive) big enough for all of them: it must be rejected, ``local()`` (``a``'s side as it was) must hold
    and not one byte may reach ``b``'s target or ``a``'s list. ``what`` names the shape in a failure."""
    nbytes = sum(buffer.length for buffer, _ in entries)
    if kind == "recv":
        outcome = receive(b, a, entries, b"\x99" * nbytes)
        target: Guarded | None = None
    elif kind == "send":
        target, handle = sink(b, nbytes)
        posted = b.provider.recv(b.socket, [(target.inner, handle)])
        outcome = attempt(lambda: a.provider.send(a.socket, entries))
        assert not posted.done() or posted.wait(0).status is not Status.SUCCESS, f"{what}: the receive took it"
    else:
        access = Access.WRITE if kind == "rdma_write" else Access.READ
        target, descriptor = window(b, nbytes, access, fill=0x5A)
        outcome = attempt(lambda: getattr(a.provider, kind)(a.socket, entries, descriptor, 0))
    assert rejected(outcome), f"{what}: {kind} accepted, {outcome}"
    if isinstance(outcome, Completion):
        assert outcome.bytes == 0, f"{what}: {outcome}"
    assert local(), f"{what}: a byte of the local list or its guards changed"
    assert target is None or target.unchanged(), f"{what}: a byte reached the peer's target"
