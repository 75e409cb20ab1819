"""Every call, every argument, every kind of bad value, each alone: generated from the reference order
(``faults``: CONTRACT.md section 4), not written call by call.

At the call: a refused call gets the contract's answer (with one fault there is no choice of which to report) and
changes nothing: no registration, proxy allocation, byte, socket state or pending operation of the world's. After
the call (``entry.handle``: a stale, junk or another socket's handle in a scatter list, on a zero-length entry
too): the operation completes with an error, LOCAL_PROTECTION, moving 0 bytes, each on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pytest_san import Access, Backend, SanError, Status, WsaError
from pytest_san.spi.checks import CALLS, answer

from .faults import AFTER_CALL, SLOTS, Fault, cases, run_cases
from .support import NEEDS_READ, TIMEOUT, RawEnd, close_ends, sink, source, window

READS = ("rdma_read", "rdma_read_burst")
BURSTS = ("rdma_write_burst", "rdma_read_burst")


def _marks(call: str) -> list[Any]:
    return [NEEDS_READ] if call in READS else []


def _rules(call: str) -> Any:
    """R14 (the error codes), and R13 for a deregistration (an unknown or in-use handle: WSAEINVAL)."""
    return pytest.mark.san_rule(*(("R13", "R14") if call.startswith("deregister") else ("R14",)))


SCATTER = pytest.mark.san_requires("rdma_read_scatter")
"""A device may read into one buffer only: a read's second entry is tried where the nodes read into several."""


def _calls() -> list[Any]:
    out = []
    for c in CALLS:
        if not SLOTS[c]:
            continue
        out.append(pytest.param(c, False, marks=[*_marks(c), _rules(c)], id=c))
        if c in READS and any(f.slot.startswith("local_buffers[1]") for f in SLOTS[c]):
            out.append(pytest.param(c, True, marks=[*_marks(c), _rules(c), SCATTER], id=f"{c}-second-entry"))
    return out


def _second(case: Any) -> bool:
    return any(f.slot.startswith("local_buffers[1]") for f in case.faults)


@pytest.mark.parametrize(("call", "second"), _calls())
def test_every_bad_argument_alone_gets_its_answer_and_changes_nothing(san_backend: Backend, call: str,
                                                                      second: bool) -> None:
    """Each fault ``KINDS`` generates for this call, alone: the answer of its check, and nothing changed (an RDMA
    read's second entry apart: it needs ``rdma_read_scatter``)."""
    chosen = [c for c in cases([call], pairs=False) if not _closed(c)]
    if call in READS:
        chosen = [c for c in chosen if _second(c) == second]
    _judge(san_backend, call, chosen, scatter_read=second if call in READS else None)


def _judge(backend: Backend, call: str, chosen: list[Any], scatter_read: bool | None) -> None:
    """Make ``chosen`` (cases of ``call``) in the world of bad arguments: each must get its answer, change nothing."""
    if len(backend.nodes) < 2:
        pytest.skip("the world of bad arguments needs two nodes")
    problems = run_cases(backend, chosen, scatter_read=scatter_read)
    assert not problems, f"{call}: {len(problems)} case(s) wrong:\n" + "\n".join(problems)


CLOSED = ("closed", "its peer closed")
"""The socket kinds of a connection no longer established (R4)."""


def _closed(case: Any) -> bool:
    return case.fault("socket") in CLOSED


@pytest.mark.san_rule("R4", "R14")
@pytest.mark.parametrize("call", [pytest.param(c, marks=_marks(c), id=c) for c in CALLS
                                  if any(f.slot == "socket" and f.name in CLOSED for f in SLOTS[c])])
def test_a_socket_no_longer_connected_takes_no_call(san_backend: Backend, call: str) -> None:
    """R4: memory is reachable only while the connection is established, and a socket closed here, or whose peer
    closed, takes no call of any kind: each gets the contract's answer and changes nothing."""
    _judge(san_backend, call, [c for c in cases([call], pairs=False) if _closed(c)],
           scatter_read=False if call in READS else None)


def _after_call() -> list[Any]:
    out = []
    for call, faults in AFTER_CALL.items():
        if call in BURSTS or call == "recv":
            continue  # a burst's entries are rdma_*'s; a receive's error completes only when a message arrives
        for fault in faults:
            rules = {"stale": ("R3", "R14"), "another socket's": ("R1", "R14"), "junk": ("R14",)}[fault.name]
            scatter = [SCATTER] if call in READS and fault.slot.startswith("local_buffers[1]") else []
            out.append(pytest.param(call, fault, marks=[*_marks(call), *scatter, pytest.mark.san_rule(*rules)],
                                    id=f"{call}-{fault}"))
    return out


@pytest.mark.parametrize(("call", "fault"), _after_call())
def test_a_bad_handle_in_any_entry_completes_with_local_protection(
        san_backend: Backend, raw_pair: tuple[RawEnd, RawEnd], call: str, fault: Fault,
        closing: list[RawEnd]) -> None:
    """A handle the socket does not hold, in any entry of a scatter list (the second entry is zero-length): the
    operation completes LOCAL_PROTECTION with 0 bytes, whatever the other entries hold; the peer's memory is
    unchanged. A zero-length entry moves nothing, but its handle is still checked."""
    a, b = raw_pair
    index = int(fault.slot.split("[", 1)[1].split("]", 1)[0])
    buf, handle = source(a, b"S" * 32)
    bad = _bad_handle(fault.name, san_backend, a, buf, closing)
    entries = [(buf.view(0, 16), handle), (buf.view(16, 0), handle)]
    if call in READS and index == 0:
        entries = entries[:1]  # a device may read into one buffer only: two need rdma_read_scatter
    entries[index] = (entries[index][0], bad)
    try:
        if call == "send":
            g, dh = sink(b, 64)
            b.provider.recv(b.socket, [(g.inner, dh)])
            op = a.provider.send(a.socket, entries)
        else:
            g, descriptor = window(b, 64, Access.READWRITE)
            op = getattr(a.provider, call)(a.socket, entries, descriptor, 0)
    except SanError as exc:
        # A provider may check its entries itself and refuse them at the call (a documented alternative,
        # refused-at-the-call: WSAEINVAL or WSAEFAULT); then nothing moved.
        assert exc.code in (WsaError.WSAEINVAL, WsaError.WSAEFAULT), (
            f"{call} with {fault} was refused at the call with {exc.code.name}; the contract says an error "
            "completion, LOCAL_PROTECTION (or, refused at the call, WSAEINVAL or WSAEFAULT)")
        assert g.unchanged(), f"{call} with {fault} changed the peer's memory"
        return
    done = op.wait(timeout=TIMEOUT)
    expected = {Status.LOCAL_PROTECTION}
    if "verbs" in san_backend.capabilities:
        expected.add(Status.REMOTE_OPERATION)  # the model's unknown-lkey-status: rxe, siw
    assert done.status in expected and done.bytes == 0, (
        f"{call} with {fault}: completed {done.status.name} moving {done.bytes} bytes; "
        f"the contract says {answer(call, 'entry.handle')}, 0 bytes")
    assert g.unchanged(), f"{call} with {fault} changed the peer's memory"


@pytest.fixture
def closing(san_backend: Backend) -> Iterator[list[RawEnd]]:
    """Ends a scenario makes beyond its pair, closed after it."""
    made: list[RawEnd] = []
    yield made
    close_ends(san_backend, made)


def _bad_handle(kind: str, backend: Backend, end: RawEnd, buf: Any, closing: list[RawEnd]) -> Any:
    """A handle ``end``'s socket does not hold: ``junk``, ``stale`` (deregistered) or ``another socket's`` (made
    only for that kind: another connection costs a connect; closing it releases the handle)."""
    if kind == "junk":
        return 0x7FFF_FFFF
    if kind == "stale":
        handle = end.provider.register_memory(end.socket, buf.view(0, 8), Access.READWRITE)
        end.provider.deregister_memory(end.socket, handle)
        return handle
    peer = backend.nodes[min(1, len(backend.nodes) - 1)].default_process
    other, other_peer = backend.connect_sockets(end.process, peer)
    closing += [RawEnd(other, end.process, end.provider, end.proxy),
                RawEnd(other_peer, peer, peer.node.provider, peer.node.proxy)]
    return end.provider.register_memory(other, buf.view(0, 16), Access.READWRITE)
