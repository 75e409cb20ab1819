"""Bad input over shapes (CONTRACT.md section 4): a buffer whose address or length is no int -- a float that
equals the right address, True for a length, a string -- registered, or as one entry of a scatter list at any
position. It is refused: WSAEINVAL at the call, or an error completion that moved no byte; never a transfer,
and nothing left registered or in use.

The buffers are duck-typed (``.address``, ``.length``, ``.process``), as the contract lets any object be one;
each names memory the caller really has, so that only the type of a number is wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pytest_san import SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE, Access, SanError, WsaError

from .support import RDMA_KINDS, RawEnd, attempt, guarded, rejected, sink, window


@dataclasses.dataclass(frozen=True)
class Duck:
    """A buffer as the contract describes one: three attributes, nothing else."""

    address: Any
    length: Any
    process: Any


def spoiled(buf: Any, how: str) -> Duck:
    """``buf`` with its address or length of the wrong type (the same value where it can be)."""
    address, length = buf.address, buf.length
    if how == "float_address":
        return Duck(float(address), length, buf.process)
    if how == "float_length":
        return Duck(address, float(length), buf.process)
    if how == "true_length":
        return Duck(address, True, buf.process)
    assert how == "str_address"
    return Duck(str(address), length, buf.process)


HOWS = ["float_address", "float_length", "true_length", "str_address"]
SHAPES = [(n, bad) for n in (1, 2, 3) for bad in range(n)]  # (entries, the position of the spoiled one)


def _regs(end: RawEnd) -> list[tuple[str, int, int, int, int]]:
    return sorted((r.kind, r.address, r.length, int(r.access), r.refs) for r in end.provider.registrations(end.socket))


@pytest.mark.san_rule("R8", "R14")
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
@pytest.mark.parametrize("how", HOWS)
def test_registering_a_buffer_of_numbers_that_are_not_ints_is_einval(raw_pair: tuple[RawEnd, RawEnd],
                                                                      register: str, how: str) -> None:
    a, _ = raw_pair
    real = a.process.alloc(64)
    before = _regs(a)
    with pytest.raises(SanError) as info:
        getattr(a.provider, register)(a.socket, spoiled(real, how), Access.READWRITE)
    assert info.value.code is WsaError.WSAEINVAL, f"expected WSAEINVAL, got {info.value}"
    assert _regs(a) == before


@pytest.mark.san_rule("R8", "R14")
@pytest.mark.parametrize("kind", [*RDMA_KINDS, "send"])
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize(("entries", "bad"), SHAPES, ids=[f"{n}-entries-bad-at-{i}" for n, i in SHAPES])
def test_a_scatter_entry_of_numbers_that_are_not_ints_moves_no_byte(raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                                     how: str, entries: int, bad: int) -> None:
    """Every entry but one is good and registered; the spoiled one names registered memory too."""
    a, b = raw_pair
    local = guarded(a, 16 * entries, 0x5A)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READWRITE)
    views = [local.inner.view(16 * i, 16) for i in range(entries)]
    scatter: list[tuple[Any, Any]] = [(view, handle) for view in views]
    scatter[bad] = (spoiled(views[bad], how), handle)
    if kind == "send":  # a receive is waiting, so that an accepted send would complete
        target, recv_handle = sink(b, 16 * entries)
        b.provider.recv(b.socket, [(target.inner, recv_handle)])
        call = lambda: a.provider.send(a.socket, scatter)  # noqa: E731
    else:
        target, desc = window(b, 16 * entries, Access.READWRITE)
        call = lambda: getattr(a.provider, kind)(a.socket, scatter, desc, 0)  # noqa: E731
    before = _regs(a), _regs(b)
    outcome = attempt(call)
    assert rejected(outcome), f"accepted: {outcome}"
    if isinstance(outcome, SanError):
        assert outcome.code is WsaError.WSAEINVAL, outcome
    else:
        assert outcome.bytes == 0, outcome
    assert target.unchanged() and local.unchanged(), "bytes moved"
    assert (_regs(a), _regs(b)) == before
    a.provider.deregister_memory(a.socket, handle)  # never left marked in use


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("option", [float(SO_MAX_RDMA_SIZE), float(SO_RDMA_THRESHOLD_SIZE), str(SO_MAX_RDMA_SIZE)],
                         ids=["max-as-float", "threshold-as-float", "max-as-str"])
def test_getsockopt_of_a_value_that_only_equals_an_option_is_einval(raw_pair: tuple[RawEnd, RawEnd],
                                                                   option: object) -> None:
    a, _ = raw_pair
    with pytest.raises(SanError) as info:
        a.provider.getsockopt(a.socket, option)
    assert info.value.code is WsaError.WSAEINVAL, f"expected WSAEINVAL, got {info.value}"


@pytest.mark.san_rule("R8", "R14")
@pytest.mark.parametrize("kind", RDMA_KINDS)
@pytest.mark.parametrize("offset", [0.0, True, "0", None], ids=repr)
def test_an_rdma_offset_that_is_not_an_int_is_einval(raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                     offset: object) -> None:
    """An offset that only equals 0, or none at all: WSAEINVAL at the call, no byte moved, nothing left in use."""
    a, b = raw_pair
    local = guarded(a, 32, 0x5A)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READWRITE)
    target, desc = window(b, 32, Access.READWRITE)
    with pytest.raises(SanError) as info:
        getattr(a.provider, kind)(a.socket, [(local.inner, handle)], desc, offset)
    assert info.value.code is WsaError.WSAEINVAL, f"expected WSAEINVAL, got {info.value}"
    assert target.unchanged() and local.unchanged()
    a.provider.deregister_memory(a.socket, handle)  # never left marked in use


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
@pytest.mark.parametrize("access", [1, 2, 3], ids=["int-1", "int-2", "int-3"])
def test_registering_with_a_plain_int_access_is_the_same_as_the_flag(raw_pair: tuple[RawEnd, RawEnd], register: str,
                                                                      access: int) -> None:
    """Access is 1, 2 or 3, as an int or as an Access value (CONTRACT.md section 2): a plain int registers."""
    a, _ = raw_pair
    buf = a.process.alloc(64)
    key = getattr(a.provider, register)(a.socket, buf, access)
    (a.provider.deregister_memory if register == "register_memory" else a.provider.deregister_rdma_memory)(
        a.socket, key)
