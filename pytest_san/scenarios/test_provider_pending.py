"""Pending operations at the provider's edges, each a property over seeded shapes: a send queue filled until it
is full (R14), a socket closed with operations pending on it or on its peer (R11, R4), operations held
(capability ``faults``) and released after one of them fails (R4), and scatter lists or deregistrations
naming a handle of a type the provider never hands out (R14, section 4)."""

from __future__ import annotations

import random
import zlib

import pytest

from pytest_san import Access, Backend, Buffer, PendingOperation, SanError, Status, WsaError
from pytest_san.batch import batch, values

from .support import (
    MAX_SGE,
    TIMEOUT,
    RawEnd,
    expect_error,
    guarded,
    lay_out,
    sink,
    source,
    transfer_is_rejected,
    window,
)

ENOUGH = 100_000
"""Far beyond any provider's queue: a loop that posts this many without WSAENETDOWN found no limit."""


def _rng(scenario: str) -> random.Random:
    return random.Random(zlib.crc32(scenario.encode()))


def _lists(scenario: str, count: int) -> list[tuple[int, ...]]:
    """``count`` scatter lists (their entries' lengths): one of MAX_SGE entries, then drawn ones."""
    rng = _rng(scenario)
    sizes = [MAX_SGE] + [rng.randint(1, MAX_SGE) for _ in range(count - 1)]
    return [tuple(rng.randint(1, 48) for _ in range(n)) for n in sizes]


def _is_error(status: object) -> bool:
    """A completion status of the contract's table other than SUCCESS (never a stand-in for one)."""
    return isinstance(status, Status) and status is not Status.SUCCESS


# -- a full send queue --------------------------------------------------------------------------------------------


@pytest.mark.san_rule("R14")
@pytest.mark.san_requires("send_waits")  # a send stays pending until a receive takes it: the queue can fill
@pytest.mark.parametrize("lengths", _lists("full send queue", 3), ids=lambda n: f"{len(n)}x{sum(n)}B")
def test_a_full_send_queue_is_enetdown_and_loses_no_send(san_backend: Backend, raw_pair: tuple[RawEnd, RawEnd],
                                                         lengths: tuple[int, ...]) -> None:
    """Sends posted while the peer posts no receive stay pending until the send queue is full; the next is
    WSAENETDOWN. Every send posted before it is then taken, whole, by a receive of the peer; after that the
    queue takes sends again."""
    a, b = raw_pair
    fills = list(range(1, len(lengths) + 1))
    parts = lay_out(san_backend, a, lengths, [Access.READ] * len(lengths), fills)
    entries = [(parts.entry(i), parts.handles[i]) for i in range(len(lengths))]
    data = b"".join(bytes([fill]) * n for fill, n in zip(fills, lengths, strict=True))
    posted = []
    with pytest.raises(SanError) as err:
        for _ in range(ENOUGH):
            posted.append(a.provider.send(a.socket, entries))
    assert err.value.code is WsaError.WSAENETDOWN, err.value
    with batch(san_backend) as bt:
        done = [bt.call(op.done) for op in posted]
    assert posted and not any(values(done)), "a send completed before any receive took it"
    slots = guarded(b, (len(posted) + 1) * len(data), fill=0x11)
    handle = b.provider.register_memory(b.socket, slots.inner, Access.WRITE)
    for i in range(len(posted) + 1):  # one more: a full queue has room again once its sends are taken
        if i == len(posted):
            posted.append(a.provider.send(a.socket, entries))
        slot = slots.inner.view(i * len(data), len(data))
        done = b.provider.recv(b.socket, [(slot, handle)]).wait(TIMEOUT)
        assert done.status is Status.SUCCESS and done.bytes == len(data), f"receive #{i}: {done}"
        assert slot.read() == data, f"receive #{i} got other bytes"
    for i, op in enumerate(posted):
        done = op.wait(TIMEOUT)
        assert done.status is Status.SUCCESS and done.bytes == len(data), f"send #{i}: {done}"
    assert slots.intact() and parts.unchanged()


# -- closing with operations pending ------------------------------------------------------------------------------

_SENDS = pytest.mark.san_requires("send_waits")
CLOSES = [pytest.param("send", "owner", marks=_SENDS, id="sends-owner-closes"),
          pytest.param("recv", "owner", id="receives-owner-closes"),
          pytest.param("recv", "peer", id="receives-peer-closes")]
"""(what is pending, who closes). A send pending when the peer closes is left out: the contract says only
that a pending *receive* then completes with an error (R4)."""


@pytest.mark.san_rule("R11", "R4")
@pytest.mark.parametrize("lengths", _lists("close with pending", 2), ids=lambda n: f"{len(n)}-pending")
@pytest.mark.parametrize(("kind", "closer"), CLOSES)
def test_closing_completes_every_pending_operation_on_either_end(san_backend: Backend,
                                                                  raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                                  closer: str, lengths: tuple[int, ...]) -> None:
    """Operations pending on a socket (sends no receive took, receives no send filled, one per length) when it
    closes complete ABORTED; receives pending when the peer closes complete with an error. None moves a byte."""
    a, b = raw_pair
    pending = []
    buffers: list[Buffer] = []
    for i, n in enumerate(lengths):
        if kind == "send":
            buf, handle = source(a, bytes([0x30 + i]) * n)
            pending.append(a.provider.send(a.socket, [(buf, handle)]))
        else:
            g, handle = sink(a, n)
            buffers.append(g.whole)
            pending.append(a.provider.recv(a.socket, [(g.inner, handle)]))
    images = [buf.read() for buf in buffers]
    with batch(san_backend) as bt:
        done = [bt.call(op.done) for op in pending]
    assert not any(values(done)), "an operation completed with nothing to pair it"
    (a if closer == "owner" else b).close()
    for i, op in enumerate(pending):
        done = op.wait(TIMEOUT)
        if closer == "owner":
            assert done.status is Status.ABORTED, f"{kind} #{i} of {len(lengths)}: {done}"
        else:
            assert _is_error(done.status), f"{kind} #{i} of {len(lengths)}: {done}"
        assert done.bytes == 0, f"{kind} #{i} of {len(lengths)}: {done}"
    assert [buf.read() for buf in buffers] == images, "a pending receive's memory changed"


# -- held operations released after one fails ---------------------------------------------------------------------


def _held_shapes() -> list[tuple[int, int]]:
    """(operations, the failing one): first, middle and last of MAX_SGE, then two drawn."""
    rng = _rng("held after a failure")
    drawn = [(n, rng.randrange(n)) for n in (rng.randint(2, MAX_SGE), rng.randint(2, MAX_SGE))]
    return [(MAX_SGE, 0), (MAX_SGE, MAX_SGE // 2), (MAX_SGE, MAX_SGE - 1), *drawn]


@pytest.mark.san_rule("R4", "R8")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize(("count", "bad"), _held_shapes(), ids=lambda v: str(v))
def test_held_writes_released_after_one_fails_each_complete_with_a_status(san_backend: Backend,
                                                                          raw_pair: tuple[RawEnd, RawEnd],
                                                                          count: int, bad: int) -> None:
    """RDMA writes held on a socket, one of them one byte past its window's end, then released together: that
    one is rejected and moves no byte; each other one completes either SUCCESS with its bytes in place, or with
    an error and no byte moved (the failure may have broken the connection first). (The failing write is out of
    bounds, not into a READ window, so that a provider ignoring access fails R6's scenarios, not this one.)"""
    a, b = raw_pair
    faults = san_backend.faults
    assert faults is not None
    what = f"{count} held writes, #{bad} past its window's end"
    data = [bytes([0x40 + i]) * (16 + i) for i in range(count)]
    local = [source(a, d) for d in data]
    targets = [window(b, len(d), Access.WRITE, fill=0x22) for d in data]
    ops: list[PendingOperation | None] = []
    faults.hold(a.socket)
    try:
        for i in range(count):
            try:
                ops.append(a.provider.rdma_write(a.socket, [local[i]], targets[i][1], int(i == bad)))
            except SanError:  # a provider may refuse the bad one at the call (CONTRACT.md section 4)
                if i != bad:
                    raise
                ops.append(None)
    finally:
        faults.release(a.socket)
    for i, op in enumerate(ops):
        target = targets[i][0]
        if op is None:
            assert target.unchanged() and target.intact(), f"{what}: refused at the call, yet bytes moved"
            continue
        done = op.wait(TIMEOUT)
        assert isinstance(done.status, Status), f"{what}: #{i} {done}"
        if i == bad or done.status is not Status.SUCCESS:
            assert i != bad or done.status is not Status.SUCCESS, f"{what}: written"
            assert done.bytes == 0 and target.unchanged(), f"{what}: #{i} {done} moved bytes"
        else:
            assert done.bytes == len(data[i]) and target.inner.read() == data[i], f"{what}: #{i} {done}"
        assert target.intact(), f"{what}: #{i} wrote outside its window"


# -- handles of any type ------------------------------------------------------------------------------------------

NOT_HANDLES = [pytest.param("0", id="str"), pytest.param(2.5, id="float"), pytest.param(None, id="None"),
               pytest.param(b"\0" * 4, id="bytes"), pytest.param((0,), id="tuple")]
"""Values no provider hands out here (none equals an int, so none can equal a handle of one that uses ints): a
handle is compared by equality and may be of any type (CONTRACT.md section 2)."""


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("kind", ["send", "rdma_write", "recv"])
@pytest.mark.parametrize("bogus", NOT_HANDLES)
def test_a_value_of_any_type_as_a_handle_is_refused_cleanly(san_backend: Backend, raw_pair: tuple[RawEnd, RawEnd],
                                                            kind: str, bogus: object) -> None:
    """Such a value in a scatter list (between two good entries) rejects the transfer with no byte moved, and
    deregistering it is WSAEINVAL: never an exception of another kind."""
    a, b = raw_pair
    access = Access.READ if kind != "recv" else Access.WRITE
    parts = lay_out(san_backend, a, [8, 8, 8], [access] * 3, [1, 2, 3])
    entries = [(parts.entry(i), bogus if i == 1 else parts.handles[i]) for i in range(3)]
    transfer_is_rejected(san_backend, a, b, kind, entries, parts.unchanged, f"{kind} naming {bogus!r}")
    expect_error(WsaError.WSAEINVAL, a.provider.deregister_memory, a.socket, bogus)
