"""Bad input (CONTRACT.md section 4): refused without changing anything, and never a transfer.

A buffer of negative length, a malformed scatter list, values that only *equal* an access flag or an
integer, a connect that fails half-way: each is refused -- a SanError with the contract's code (or a
TypeError/ValueError naming the argument) at the call, or an error completion that moved no byte --
and leaves registrations, in-use marks and memory as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_san import Access, Backend, Completion, Handle, SanError, Status, WsaError
from pytest_san.spi.protocols import Switch

from .support import RDMA_KINDS, RawEnd, attempt, guarded, rejected, window

Snapshot = list[tuple[str, int, int, int, int]]


def _regs(end: RawEnd) -> Snapshot:
    return sorted((r.kind, r.address, r.length, int(r.access), r.refs) for r in end.provider.registrations(end.socket))


def _live(backend: Backend) -> list[int]:
    return [node.proxy.live_allocations() for node in backend.nodes]


def _refused_at_call(call: Callable[[], Any], *codes: WsaError, errors: tuple[type[Exception], ...] = (),
                     naming: str = "") -> None:
    """``call`` raises a SanError with one of ``codes``, or one of ``errors`` naming the argument ``naming``
    (an exception from deep inside, that names nothing, is no answer)."""
    try:
        result = call()
    except SanError as exc:
        assert exc.code in codes, f"expected one of {[c.name for c in codes]}, got {exc}"
        return
    except errors as exc:
        assert naming in str(exc), f"{type(exc).__name__} does not name {naming!r}: {exc}"
        return
    raise AssertionError(f"accepted: returned {result!r}")


def _registered(end: RawEnd, nbytes: int, fill: int) -> tuple[Any, Handle]:
    g = guarded(end, nbytes, fill)
    return g, end.provider.register_memory(end.socket, g.inner, Access.READWRITE)


# -- R8: a negative length is no range of memory; a zero-length entry moves nothing ------------------


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize("kind", RDMA_KINDS)
@pytest.mark.parametrize("good_first", [False, True], ids=["alone", "after_a_good_entry"])
def test_negative_length_local_buffer_moves_no_byte(raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                    good_first: bool) -> None:
    a, b = raw_pair
    local, handle = _registered(a, 64, 0x33)
    target, desc = window(b, 16, Access.READWRITE)
    # Inside the registered range, but of length -16: it must never be taken as a range.
    negative = a.process.buffer_at(local.inner.address + 40, -16)
    entries = [(local.inner.view(0, 8), handle)] if good_first else []
    entries.append((negative, handle))
    before = _regs(a), _regs(b)
    outcome = attempt(lambda: getattr(a.provider, kind)(a.socket, entries, desc, 0))
    assert rejected(outcome), outcome
    if isinstance(outcome, SanError):
        assert outcome.code in (WsaError.WSAEINVAL, WsaError.WSAEFAULT), outcome
    else:
        assert outcome.bytes == 0, outcome
    assert target.unchanged() and local.unchanged()  # not one byte moved, on either side
    assert (_regs(a), _regs(b)) == before
    a.provider.deregister_memory(a.socket, handle)  # never left marked in use


@pytest.mark.san_rule("R8")
def test_zero_length_entries_move_nothing(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    a, b = raw_pair
    local, handle = _registered(a, 64, 0x33)
    local.inner.write(bytes(range(64)))
    target, desc = window(b, 16, Access.WRITE)
    entries = [(local.inner.view(0, 0), handle), (local.inner.view(8, 4), handle), (local.inner.view(64, 0), handle)]
    outcome = attempt(lambda: a.provider.rdma_write(a.socket, entries, desc, 2))
    assert isinstance(outcome, Completion) and outcome.status is Status.SUCCESS and outcome.bytes == 4, outcome
    assert target.intact()
    assert target.inner.read() == bytes([0x22, 0x22, 8, 9, 10, 11]) + bytes([0x22]) * 10


# -- R13: a malformed scatter list marks nothing in use ----------------------------------------------


@pytest.mark.san_rule("R13", "R14")
@pytest.mark.parametrize("kind", [*RDMA_KINDS, "send", "recv"])
@pytest.mark.parametrize("junk", ["None", "one_tuple", "none_buffer", "three_tuple"])
def test_malformed_scatter_list_is_a_type_error_before_anything_is_in_use(raw_pair: tuple[RawEnd, RawEnd],
                                                                          kind: str, junk: str) -> None:
    a, b = raw_pair
    local, handle = _registered(a, 64, 0x33)
    target, desc = window(b, 16, Access.READWRITE)
    good = (local.inner.view(0, 8), handle)
    bad = {"None": None, "one_tuple": (local.inner,), "none_buffer": (None, handle),
           "three_tuple": (local.inner.view(0, 8), handle, 0)}[junk]
    entries = [good, bad]
    before = _regs(a), _regs(b)
    args: tuple[Any, ...] = (a.socket, entries, desc, 0) if kind.startswith("rdma") else (a.socket, entries)
    # Naming the argument (CONTRACT.md section 4): local_buffers for an RDMA call, buffers for send and recv.
    with pytest.raises(TypeError, match=r"\blocal_buffers\b" if kind.startswith("rdma") else r"\bbuffers\b"):
        getattr(a.provider, kind)(*args)
    assert (_regs(a), _regs(b)) == before
    assert target.unchanged() and local.unchanged()
    a.provider.deregister_memory(a.socket, handle)  # R13: not in use, so it deregisters


# -- R14: values that only equal a flag or an integer are no valid arguments ----------------------


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("access", [True, 1.0, 3.0, "1"], ids=["True", "1.0", "3.0", "str"])
def test_access_that_only_equals_a_flag_is_einval(raw_pair: tuple[RawEnd, RawEnd], access: Any) -> None:
    a, _ = raw_pair
    buf = a.process.alloc(64)
    before = _regs(a)
    _refused_at_call(lambda: a.provider.register_memory(a.socket, buf, access), WsaError.WSAEINVAL,
                     errors=(TypeError,), naming="access")
    assert _regs(a) == before


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("size", ["64", 64.0, None], ids=["str", "float", "none_is_fine"])
def test_descriptor_size_must_be_an_integer(raw_pair: tuple[RawEnd, RawEnd], size: Any) -> None:
    a, _ = raw_pair
    buf = a.process.alloc(64)
    before = _regs(a)
    if size is None:  # the default: no probe, just a registration
        desc = a.provider.register_rdma_memory(a.socket, buf, Access.READ, size)
        a.provider.deregister_rdma_memory(a.socket, desc)
    else:
        _refused_at_call(lambda: a.provider.register_rdma_memory(a.socket, buf, Access.READ, size),
                         WsaError.WSAEINVAL, errors=(TypeError,), naming="descriptor_size")
    assert _regs(a) == before


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("option", ["x", None, 1.5], ids=["str", "None", "float"])
def test_getsockopt_of_a_non_option_is_einval(raw_pair: tuple[RawEnd, RawEnd], option: Any) -> None:
    a, _ = raw_pair
    _refused_at_call(lambda: a.provider.getsockopt(a.socket, option), WsaError.WSAEINVAL)


@pytest.mark.san_rule("R14")
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
def test_registering_no_buffer_at_all_is_refused(raw_pair: tuple[RawEnd, RawEnd], register: str) -> None:
    a, _ = raw_pair
    before = _regs(a)
    _refused_at_call(lambda: getattr(a.provider, register)(a.socket, None, Access.READ),
                     WsaError.WSAEFAULT, WsaError.WSAEINVAL, errors=(TypeError,), naming="buffer")
    assert _regs(a) == before


@pytest.mark.san_rule("R8", "R14")
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
def test_registering_a_negative_length_is_einval(raw_pair: tuple[RawEnd, RawEnd], register: str) -> None:
    a, _ = raw_pair
    buf = a.process.alloc(4096)
    before = _regs(a)
    negative = a.process.buffer_at(buf.address + 2048, -1024)
    _refused_at_call(lambda: getattr(a.provider, register)(a.socket, negative, Access.READ), WsaError.WSAEINVAL)
    assert _regs(a) == before


# -- R11: a connect is all or nothing ------------------------------------------------------------------


@pytest.mark.san_rule("R11")
@pytest.mark.san_requires("faults")
@pytest.mark.parametrize("side", ["local", "remote"])
def test_failed_connect_releases_everything_it_built(san_backend: Backend, san_switch: Switch, side: str) -> None:
    nodes = san_backend.nodes
    node = nodes[0] if side == "local" else nodes[min(1, len(nodes) - 1)]
    faults = san_backend.faults
    assert faults is not None
    before = _live(san_backend)
    faults.fail_allocations(node, 1)  # "remote": the local end was complete when it fails
    try:
        with pytest.raises(SanError) as info:
            san_switch.connect()
    finally:
        faults.fail_allocations(node, 0)
    assert info.value.code is WsaError.WSAENOBUFS
    assert san_backend.leaks() == []  # no registration, no proxy allocation left behind
    assert _live(san_backend) == before
    conn = san_switch.connect()  # and the SAN is as good as before
    conn.local.send(b"after the failure")
    assert conn.remote.recv(17) == b"after the failure"


@pytest.mark.san_rule("R11")
@pytest.mark.parametrize("options", [{"bogus": 1}, {"message_size": "4096"}, {"message_count": 0},
                                     {"rdma_mode": "sideways"}, {"peer": "node1"}],
                         ids=["unknown", "size_str", "count_0", "mode", "peer_str"])
def test_connect_with_bad_arguments_builds_nothing(san_backend: Backend, san_switch: Switch,
                                                   options: dict[str, Any]) -> None:
    before = _live(san_backend)
    with pytest.raises((TypeError, ValueError)):
        san_switch.connect(**options)
    assert san_backend.leaks() == [] and _live(san_backend) == before
