"""A burst's count and depth (``pytest_san.spi.burst``, CONTRACT.md's reference order, row 1): any integer >= 1 is
taken, 1 included, each apart from the other (a seeded draw of pairs); 0, a negative, a float or a bool in
either is WSAEINVAL at the call, and nothing moves.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from pytest_san import Access, Status, WsaError
from pytest_san.spi.burst import rdma_read_burst, rdma_write_burst

from .support import NEEDS_READ, TIMEOUT, RawEnd, expect_error, guarded, window

SIZE = 64
_rng = random.Random("test_checks_burst")
TAKEN = [(1, 1), (1, 16), (3, 1), *((_rng.randint(1, 40), _rng.randint(1, 20)) for _ in range(3))]
REFUSED = [(1, 0), (0, 1), (1, -2), (-1, 1), (1, 2.0), (1.0, 1), (True, 4), (4, True)]
BURSTS = {"rdma_write": rdma_write_burst, "rdma_read": rdma_read_burst}
KINDS = ["rdma_write", pytest.param("rdma_read", marks=NEEDS_READ)]


@pytest.mark.san_rule("R8", "R14")
@pytest.mark.parametrize(("count", "depth"), TAKEN, ids=[f"count-{c}-depth-{d}" for c, d in TAKEN])
@pytest.mark.parametrize("kind", KINDS)
def test_any_count_and_depth_of_at_least_one_is_taken(raw_pair: tuple[RawEnd, RawEnd], kind: str, count: int,
                                                      depth: int) -> None:
    a, b = raw_pair
    local = guarded(a, SIZE, 0x5A)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READWRITE)
    target, desc = window(b, SIZE, Access.READWRITE)
    done = BURSTS[kind](a.provider, a.socket, [(local.inner, handle)], desc, count=count,
                        depth=depth).wait(timeout=TIMEOUT)
    assert done.status is Status.SUCCESS and done.bytes == count * SIZE, done
    moved_to = local if kind == "rdma_read" else target
    assert moved_to.inner.read() == bytes([0x22 if kind == "rdma_read" else 0x5A]) * SIZE and moved_to.intact()
    a.provider.deregister_memory(a.socket, handle)  # nothing left in use once it completed


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize(("count", "depth"), REFUSED, ids=[f"count-{c!r}-depth-{d!r}" for c, d in REFUSED])
@pytest.mark.parametrize("kind", KINDS)
def test_a_count_or_depth_that_is_no_integer_of_at_least_one_is_einval(raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                                       count: Any, depth: Any) -> None:
    a, b = raw_pair
    local = guarded(a, SIZE, 0x5A)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READWRITE)
    target, desc = window(b, SIZE, Access.READWRITE)
    expect_error(WsaError.WSAEINVAL, lambda: BURSTS[kind](a.provider, a.socket, [(local.inner, handle)], desc,
                                                         count=count, depth=depth))  # bad on purpose
    assert target.unchanged() and local.unchanged()
    a.provider.deregister_memory(a.socket, handle)  # nothing left in use
