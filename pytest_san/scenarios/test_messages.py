"""Send and receive at the provider level: registered message buffers only (R6, R7, R14), and the byte count of
each message received (R9)."""

from __future__ import annotations

import functools

import pytest

from pytest_san import Access, Status

from .support import TIMEOUT, RawEnd, attempt, rejected, sink, source, succeeded


@pytest.mark.san_rule("R6", "R7")
def test_send_lands_in_the_posted_receive(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    a, b = raw_pair
    g, rh = sink(b, 256)
    recv = b.provider.recv(b.socket, [(g.inner, rh)])
    buf, sh = source(a, b"m" * 200)
    assert succeeded(attempt(lambda: a.provider.send(a.socket, [(buf, sh)])), 200)
    done = recv.wait(timeout=TIMEOUT)
    assert done.status is Status.SUCCESS and done.bytes == 200
    assert g.inner.read(200) == b"m" * 200 and g.inner.read(56, 200) == b"\x11" * 56 and g.intact()


SEND_SHAPES = [  # (the send's entries, the receive's entries): lengths in bytes
    pytest.param((100, 100, 100), (120, 180), id="3-into-2"),
    pytest.param((64,), (16, 16, 16, 16), id="1-into-4"),
    pytest.param((1, 200, 7, 30), (238,), id="4-into-1"),
]


@pytest.mark.san_rule("R14")
@pytest.mark.san_requires("send_waits")  # iWARP has no receiver-not-ready flow control (docs/lab.md: the verbs engine)
@pytest.mark.parametrize(("sent", "taken"), SEND_SHAPES)
def test_send_waits_for_a_receive_and_scatters(raw_pair: tuple[RawEnd, RawEnd], sent: tuple[int, ...],
                                               taken: tuple[int, ...]) -> None:
    """A send posted before the peer's receive stays pending (it is not done, however often asked, and the
    peer's memory is untouched) until the receive takes it; then both complete and the bytes scatter in order."""
    a, b = raw_pair
    data = bytes(range(1, len(sent) + 1))
    parts = [source(a, bytes([byte]) * n) for byte, n in zip(data, sent, strict=True)]
    sinks = [sink(b, n) for n in taken]
    send = a.provider.send(a.socket, parts)  # no receive posted yet: flow control keeps it pending
    assert not send.done(), "the send completed before any receive took it"
    assert all(g.unchanged() for g, _ in sinks)
    assert not send.done(), "the send completed before any receive took it"
    recv = b.provider.recv(b.socket, [(g.inner, h) for g, h in sinks])
    done = send.wait(timeout=TIMEOUT)
    assert done.status is Status.SUCCESS and done.bytes == sum(sent), done
    assert recv.wait(timeout=TIMEOUT).bytes == sum(sent)
    expected = b"".join(bytes([byte]) * n for byte, n in zip(data, sent, strict=True))
    landed = b"".join(g.inner.read() for g, _ in sinks)
    assert landed[:len(expected)] == expected and set(landed[len(expected):]) <= {0x11}
    assert all(g.intact() for g, _ in sinks)


@pytest.mark.san_rule("R1")
def test_receive_into_unregistered_memory_is_rejected(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    _, b = raw_pair
    g, rh = sink(b, 64)
    stray = b.process.alloc(64)  # never registered, but named with a valid handle
    assert rejected(attempt(lambda: b.provider.recv(b.socket, [(stray, rh)])))
    assert stray.read() == bytes(64) and g.unchanged()


@pytest.mark.san_rule("R7")
def test_send_from_write_only_region_is_rejected(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    a, b = raw_pair
    g, rh = sink(b, 64)
    recv = b.provider.recv(b.socket, [(g.inner, rh)])
    buf, sh = source(a, b"s" * 64, Access.WRITE)
    assert rejected(attempt(lambda: a.provider.send(a.socket, [(buf, sh)])))
    assert g.unchanged()
    assert not recv.done() or recv.wait(0).status is not Status.SUCCESS


RING = [1, 127, 128, 40, 77]
"""Lengths of the messages sent into one ring of 128-byte receive slots."""


@pytest.mark.san_rule("R9")
def test_each_receive_of_a_message_ring_reports_its_message_length(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    """R9's receive region: one registration holding a ring of equal slots, a receive posted on each slot.
    Messages of different lengths each complete one receive, in the order posted, reporting the bytes of its own
    message (the length a switch reads its messages by), which lie at the start of its slot; the rest of the slot
    is untouched."""
    a, b = raw_pair
    slot = 128
    ring, handle = sink(b, slot * len(RING))
    recvs = [b.provider.recv(b.socket, [(ring.inner.view(i * slot, slot), handle)]) for i in range(len(RING))]
    for i, n in enumerate(RING):
        entry = source(a, bytes([0x40 + i]) * n)
        assert succeeded(attempt(functools.partial(a.provider.send, a.socket, [entry])), n)
    for i, (recv, n) in enumerate(zip(recvs, RING, strict=True)):
        done = recv.wait(timeout=TIMEOUT)
        assert done.status is Status.SUCCESS and done.bytes == n, f"message {i} of {n} bytes completed as {done}"
        assert ring.inner.read(slot, i * slot) == bytes([0x40 + i]) * n + b"\x11" * (slot - n)
    assert ring.intact()
