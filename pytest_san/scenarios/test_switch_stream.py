"""The switch as a byte stream (R9, R10): every length around the message size, the RDMA threshold and the
provider's largest RDMA, both directions at once, read back in pieces of any length; every byte arrives once, in
order, and every transfer's registrations are gone once it is done."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pytest_san import SO_MAX_RDMA_SIZE
from pytest_san.spi.protocols import Switch, SwitchConnection, SwitchEndpoint

from .support import NEEDS_READ, TIMEOUT

MODES = [pytest.param("read", marks=NEEDS_READ), "write"]
LARGEST_STEP = 4 << 20
"""Transfers around the provider's largest single RDMA (SO_MAX_RDMA_SIZE) only when it is at most this."""


def _rdma_calls(conn: SwitchConnection) -> list[tuple[str, str]]:
    return [t for t in conn.trace if t[1] in ("register_rdma_memory", "rdma_read", "rdma_write")]


def _registered(end: SwitchEndpoint) -> int:
    return len(end.provider.registrations(end.socket))


def _around(n: int) -> list[int]:
    return [n - 1, n, n + 1]


def _lengths(rng: random.Random, size: int, threshold: int, step: int) -> list[int]:
    """Inline lengths around one and several messages (whatever a message's header takes), and lengths around
    the threshold and the largest single RDMA."""
    inline = [0, 1, *range(size - 17, size + 2), 2 * size - 16, 2 * size + 1, 3 * size + 5, *_around(threshold)]
    large = [threshold + 1 + rng.randrange(3 * size)]
    if step <= LARGEST_STEP:
        large += [*_around(step), 2 * step + 1]
    return [n for n in inline if 0 <= n <= threshold] + large


@pytest.mark.san_rule("R9", "R10")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_every_length_arrives_once_in_order_both_ways(san_switch: Switch, mode: str, seed: int) -> None:
    """Both ends send pieces of every length at once, and each reads the other's stream back in pieces of any
    length (0 and 1 included) while more is sent: it gets exactly the bytes sent, in order."""
    rng = random.Random(seed)
    size, count = rng.choice([64, 100, 1024]), rng.choice([3, 4, 8])
    threshold = rng.choice([size, 3 * size + 7, 8 * size])
    conn = san_switch.connect(rdma_threshold=threshold, rdma_mode=mode, message_size=size, message_count=count)
    size, threshold = conn.message_size, conn.rdma_threshold  # what the switch uses (it may choose others)
    ends = (conn.local, conn.remote)
    step = conn.local.provider.getsockopt(conn.local.socket, SO_MAX_RDMA_SIZE)
    lengths = _lengths(rng, size, threshold, step)
    big = [n for n in lengths if n > threshold]
    order = [*lengths, *(rng.choice(lengths[:-len(big)]) for _ in range(12))]
    rng.shuffle(order)
    sent = (bytearray(), bytearray())  # what each end sent
    got = [0, 0]  # how much of it the other end read
    for i, n in enumerate(order):
        which = i % 2 if rng.random() < 0.7 else rng.randrange(2)
        data = rng.randbytes(n)
        ends[which].send(data)
        sent[which].extend(data)
        reader = rng.randrange(2)  # reads some of what the other end sent
        left = len(sent[1 - reader]) - got[reader]
        want = rng.choice([0, 1, min(left, size), left // 2, left])
        if want <= left:
            assert ends[reader].recv(want, timeout=TIMEOUT) == sent[1 - reader][got[reader]:got[reader] + want]
            got[reader] += want
    for reader in (0, 1):
        assert ends[reader].recv(len(sent[1 - reader]) - got[reader], timeout=TIMEOUT) == sent[1 - reader][got[reader]:]
    conn.flush(timeout=TIMEOUT)
    assert [_registered(end) for end in ends] == [2, 2]  # the transfers' registrations are gone again
    assert {t[1] for t in _rdma_calls(conn)} >= {"register_rdma_memory", f"rdma_{mode}"}


@pytest.mark.san_rule("R9", "R10")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("moves", range(4))
def test_flush_finishes_every_transfer_before_any_is_read(san_switch: Switch, mode: str, moves: int) -> None:
    """``flush`` returns only when every queued message and large transfer of both ends is done, wherever the two
    ends stood when it was called (the receiver's end moved ``moves`` times before): the transfer's RDMA has
    happened and its registrations are gone before the application reads a byte."""
    conn = san_switch.connect(rdma_threshold=4096, rdma_mode=mode, message_size=256, message_count=3)
    a, b = conn.local, conn.remote
    small = bytes(range(256)) * (conn.message_count + 3)  # at most the threshold, more messages than receives
    small = small[:min(len(small), conn.rdma_threshold)]
    large = (bytes(range(251)) * (conn.rdma_threshold // 251 + 2))[:conn.rdma_threshold + 1 + 4096]
    a.send(small)
    a.send(large)
    for i in range(moves):
        (b, a)[i % 2].progress()
    conn.flush(timeout=TIMEOUT)
    assert (_registered(a), _registered(b)) == (2, 2)
    initiator = "remote" if mode == "read" else "local"
    assert (initiator, f"rdma_{mode}") in conn.trace
    assert b.recv(len(small) + len(large), timeout=TIMEOUT) == small + large


@pytest.mark.san_rule("R9")
def test_recv_takes_a_byte_count_and_a_timeout_and_loses_nothing(san_switch: Switch) -> None:
    """A receive of zero bytes returns nothing; a byte count that is not a whole number >= 0, or a timeout that
    is not a number of seconds (NaN included), is refused (TypeError, ValueError) before a byte is taken."""
    conn = san_switch.connect()
    conn.local.send(b"abc")
    assert conn.remote.recv(0) == b""
    bad: list[tuple[tuple[Any, ...], dict[str, Any], type[Exception] | tuple[type[Exception], ...]]] = [
        ((True,), {}, TypeError), ((1.0,), {}, TypeError), ((-1,), {}, ValueError),
        ((1,), {"timeout": True}, TypeError), ((1,), {"timeout": "1"}, TypeError),
        ((1,), {"timeout": float("nan")}, (TypeError, ValueError))]
    for args, kwargs, error in bad:
        with pytest.raises(error):
            conn.remote.recv(*args, **kwargs)  # bad arguments on purpose
    assert conn.remote.recv(3, timeout=TIMEOUT) == b"abc"
