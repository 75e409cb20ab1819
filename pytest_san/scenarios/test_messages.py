"""Send and receive at the provider level: registered message buffers only (R6, R7, R14)."""

from __future__ import annotations

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


@pytest.mark.san_rule("R14")
@pytest.mark.san_requires("send_waits")  # iWARP has no receiver-not-ready flow control (docs/lab.md: the verbs engine)
def test_send_waits_for_a_receive_and_scatters(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    a, b = raw_pair
    parts = [source(a, bytes([i]) * 100) for i in (1, 2, 3)]
    send = a.provider.send(a.socket, parts)  # no receive posted yet: flow control keeps it pending
    first, h1 = sink(b, 120)
    second, h2 = sink(b, 180)
    recv = b.provider.recv(b.socket, [(first.inner, h1), (second.inner, h2)])
    assert send.wait(timeout=TIMEOUT).status is Status.SUCCESS
    assert recv.wait(timeout=TIMEOUT).bytes == 300
    assert first.inner.read() == b"\x01" * 100 + b"\x02" * 20
    assert second.inner.read() == b"\x02" * 80 + b"\x03" * 100 and first.intact() and second.intact()


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
