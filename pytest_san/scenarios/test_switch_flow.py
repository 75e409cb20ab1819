"""The switch's flow control (R9): a message goes only into a receive the peer has posted, however many small
sends meet however small a window, in both directions at once, and nothing waits for ever."""

from __future__ import annotations

import random

import pytest

from pytest_san import Backend
from pytest_san.spi.protocols import Faults, Switch, SwitchConnection

from .support import TIMEOUT


def _calls(conn: SwitchConnection, name: str, method: str) -> int:
    return conn.trace.count((name, method))


def _untraced(conn: SwitchConnection, count: int) -> dict[str, int]:
    """The receives each end posted at connect that its trace leaves out: none when the trace lists them (as the
    protocol asks: every provider call), else the ring of ``count`` (pytest-san's own switch leaves them out).
    Read right after connect: a switch that lists its first ring must not be credited with it twice."""
    return {name: 0 if _calls(conn, name, "recv") else count for name in ("local", "remote")}


def _check_credit(conn: SwitchConnection, untraced: dict[str, int]) -> None:
    """Each end's messages fit the receives the other end posted: those its trace lists and those it posted at
    connect without listing them (a message with no receive for it breaks the connection on iWARP)."""
    for sender, receiver in (("local", "remote"), ("remote", "local")):
        posted = untraced[receiver] + _calls(conn, receiver, "recv")
        assert _calls(conn, sender, "send") <= posted, (sender, conn.trace[-8:])


def _steps(conn: SwitchConnection, rng: random.Random, count: int, size: int, faults: Faults | None) -> None:
    """Random small sends (one message, several, a burst of many) from either end, while the other end moves
    only now and then, reads a little or not at all, or (``faults``) has its operations held for a while; the
    credit check after every step, every byte in order at the end."""
    untraced = _untraced(conn, count)
    ends = (conn.local, conn.remote)
    sent = (bytearray(), bytearray())
    got = [0, 0]
    held: set[int] = set()
    for _ in range(40):
        which = rng.randrange(2)
        action = rng.random()
        if action < 0.5:  # a send of 1 to 3 messages' worth, or a burst of many small ones
            for _ in range(rng.choice([1, 1, 2, 3 * count])):
                data = rng.randbytes(rng.choice([1, size // 2, size, 3 * size]))
                ends[which].send(data)
                sent[which].extend(data)
        elif action < 0.65 and not held:  # the other end reads part of what it has been sent
            left = len(sent[1 - which]) - got[which]
            n = rng.randint(0, left)
            assert ends[which].recv(n, timeout=TIMEOUT) == sent[1 - which][got[which]:got[which] + n]
            got[which] += n
        elif action < 0.85 or faults is None:
            ends[which].progress()
        elif which in held:
            faults.release(ends[which].socket)
            held.discard(which)
        else:
            faults.hold(ends[which].socket)
            held.add(which)
        _check_credit(conn, untraced)
    for which in held:
        assert faults is not None
        faults.release(ends[which].socket)
    for which in (0, 1):
        rest = sent[1 - which][got[which]:]
        assert ends[which].recv(len(rest), timeout=TIMEOUT) == rest
        _check_credit(conn, untraced)


@pytest.mark.san_rule("R9")
@pytest.mark.parametrize("seed", range(6))
def test_messages_never_outrun_the_receives_posted_for_them(san_switch: Switch, seed: int) -> None:
    """Many small sends against a small window, in both directions at once: at every step no end has sent more
    messages than the other posted receives for, and in the end every byte arrives in order."""
    rng = random.Random(seed)
    count, size = rng.choice([3, 4, 5, 8]), rng.choice([64, 256])
    conn = san_switch.connect(rdma_threshold=1 << 20, message_size=size, message_count=count)
    count, size = conn.message_count, conn.message_size  # what the switch uses (it may choose others)
    _steps(conn, rng, count, size, None)


@pytest.mark.san_rule("R9")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize("seed", range(12))
def test_messages_never_outrun_the_receives_posted_for_them_when_completions_show_late(
        san_switch: Switch, san_backend: Backend, seed: int) -> None:
    """The same while either end's operations are held for a while (seen late, capability ``faults``): credits
    come back late, out of step with the other end's sends."""
    rng = random.Random(seed)
    count, size = rng.choice([3, 4, 5, 8]), rng.choice([64, 256])
    conn = san_switch.connect(rdma_threshold=1 << 20, message_size=size, message_count=count)
    count, size = conn.message_count, conn.message_size  # what the switch uses (it may choose others)
    _steps(conn, rng, count, size, san_backend.faults)


@pytest.mark.san_rule("R9")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize("count", [3, 4, 5, 8])
def test_a_window_of_held_completions_is_used_and_returned_whole(san_switch: Switch, san_backend: Backend,
                                                                  count: int) -> None:
    """Both ends send many small messages while the other end's operations are held (seen late, capability
    ``faults``), again and again: each uses at most the receives the other posted, and returns them, so that
    neither waits on the other for ever."""
    faults = san_backend.faults
    assert faults is not None
    conn = san_switch.connect(rdma_threshold=1 << 20, message_size=64, message_count=count)
    count = conn.message_count
    untraced = _untraced(conn, count)
    ends = (conn.local, conn.remote)
    sent = (bytearray(), bytearray())
    for round_ in range(6):
        held = ends[round_ % 2]
        faults.hold(held.socket)
        for which in (0, 1, 0, 1):
            for i in range(count + 1):
                data = bytes([round_, which, i]) * (1 + i % 50)
                ends[which].send(data)
                sent[which].extend(data)
            _check_credit(conn, untraced)
        faults.release(held.socket)
        _check_credit(conn, untraced)
    assert conn.remote.recv(len(sent[0]), timeout=TIMEOUT) == sent[0]
    assert conn.local.recv(len(sent[1]), timeout=TIMEOUT) == sent[1]
    _check_credit(conn, untraced)
