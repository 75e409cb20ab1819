"""The shapes a scatter list may take (CONTRACT.md section 2; the protocols' ``LocalBuffers`` is a sequence of
(buffer, handle) pairs): a tuple of pairs moves what the same list moves, for every transfer and a seeded draw
of entry counts and lengths. A backend that follows the reference order of checks (``reference_order``) takes
a two-item list as a pair too, as its table does (row 13: an entry that is no pair is a TypeError).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from pytest_san import Access

from .support import MAX_SGE, NEEDS_READ, RawEnd, attempt, guarded, succeeded, window

KINDS = ["rdma_write", pytest.param("rdma_read", marks=NEEDS_READ), "send"]
DRAWS = 3


def _lengths(kind: str, draw: int) -> list[int]:
    """Entry lengths for one draw: any count up to MAX_SGE (one for a read: a scatter read is optional)."""
    rng = random.Random(f"test_checks_shapes/{kind}/{draw}")
    count = 1 if kind == "rdma_read" else rng.randint(1, MAX_SGE)
    return [rng.randint(1, 40) for _ in range(count)]


def _moved(a: RawEnd, b: RawEnd, kind: str, lengths: list[int], shape: Callable[[list[Any]], Any]) -> None:
    """``a``'s entries of ``lengths`` (a pattern in them, for a read the peer's window holds it), given to ``kind``
    in ``shape``: the transfer succeeds and the destination holds the pattern, its guards intact."""
    total = sum(lengths)
    pattern = bytes((7 * i + len(lengths)) % 251 for i in range(total))
    local = guarded(a, total, 0x33)
    if kind != "rdma_read":
        local.inner.write(pattern)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READWRITE)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    entries = shape([(local.inner.view(at, n), handle) for at, n in zip(starts, lengths, strict=True)])
    if kind == "send":
        target = guarded(b, total, 0x44)
        recv_handle = b.provider.register_memory(b.socket, target.inner, Access.WRITE)
        recv = b.provider.recv(b.socket, shape([(target.inner, recv_handle)]))
        sent = attempt(lambda: a.provider.send(a.socket, entries))
        done = recv.wait(timeout=30.0)
        assert succeeded(sent, total) and succeeded(done, total), (sent, done)
        landed = target
    else:
        target, desc = window(b, total, Access.READWRITE)
        if kind == "rdma_read":
            target.inner.write(pattern)
        done = attempt(lambda: getattr(a.provider, kind)(a.socket, entries, desc, 0))
        assert succeeded(done, total), done
        landed = local if kind == "rdma_read" else target
    assert landed.inner.read() == pattern and landed.intact(), f"{kind} with {lengths}: not the bytes sent"
    a.provider.deregister_memory(a.socket, handle)  # nothing left in use


@pytest.mark.san_rule("R8", "R14")
@pytest.mark.parametrize("draw", range(DRAWS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_tuple_of_pairs_moves_what_a_list_moves(raw_pair: tuple[RawEnd, RawEnd], kind: str, draw: int) -> None:
    _moved(*raw_pair, kind, _lengths(kind, draw), tuple)


@pytest.mark.san_rule("R8", "R14")
@pytest.mark.san_requires("reference_order")
@pytest.mark.parametrize("draw", range(DRAWS))
@pytest.mark.parametrize("kind", KINDS)
def test_with_the_reference_order_a_two_item_list_is_a_pair(raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                            draw: int) -> None:
    _moved(*raw_pair, kind, _lengths(kind, draw), lambda entries: [list(pair) for pair in entries])
