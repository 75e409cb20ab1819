"""rsockets (librdmacm's ``rsocket`` API) judged as a switch, by observation: what the kernel records for each
process, and what a peer can still do with what was advertised (docs/judging-a-switch.md).

Node 0's process listens and maps memory (``riomap``), node 1's connects and writes into it (``riowrite``). A write
is known to have been placed, or refused, before anything is read back: a message sent after it on the same
connection arrives after it (one RC queue pair), or the writer's connection has ended because of it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from pytest_san.observed import RsocketsProcess, describe_hang

from .conftest import record

pytestmark = pytest.mark.san_requires("rsockets")

Spawn = Callable[[int], RsocketsProcess]
SLOTS = 4  # iomap slots per socket (RDMA_IOMAPSIZE): the control area grows by 24 bytes a slot
BUFFER = 128 * 1024  # rsockets' default send and receive buffer size
PAGE = 4096
KINDS = ("mr", "qp", "cq", "cm_id")  # what one socket holds (its PD and context are the process's)
S = base64.b64encode(b"s").decode()  # a message as the child's send and recv carry it


def connected(a: RsocketsProcess, b: RsocketsProcess, listener: int | None = None) -> tuple[int, int, int]:
    """(listening socket, accepted socket of ``a``, connected socket of ``b``)."""
    if listener is None:
        listener = a.socket(SLOTS)
    where = a.listen(listener)
    started = a.start_accept(listener)
    fd = b.socket(SLOTS)
    b.connect(fd, where)
    return listener, a.finish_accept(started), fd


def another(a: RsocketsProcess, b: RsocketsProcess, listener: int, where: Mapping[str, Any]) -> tuple[int, int]:
    started = a.start_accept(listener)
    fd = b.socket(SLOTS)
    b.connect(fd, where)
    return a.finish_accept(started), fd


def held(p: RsocketsProcess) -> Mapping[str, Any]:
    kernel = p.process.kernel()
    if "unavailable" in kernel:
        pytest.skip(f"the kernel's RDMA record cannot be read on this host: {kernel['unavailable']}")
    return kernel


def new_mrs(now: Mapping[str, Any], before: Mapping[str, Any]) -> list[dict[str, Any]]:
    old = {m.get("mrn") for m in before.get("mr", [])}
    return [m for m in now.get("mr", []) if m.get("mrn") not in old]


def left(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, list[Any]]:
    """What a socket's process holds now that it did not before, per kind of ``KINDS`` (nonempty ones)."""
    out = {}
    for kind in KINDS:
        ident = "mrn" if kind == "mr" else ("lqpn" if kind == "qp" else ("cqn" if kind == "cq" else "cm_idn"))
        old = {e.get(ident) for e in before.get(kind, [])}
        extra = [e for e in now.get(kind, []) if e.get(ident) not in old]
        if extra:
            out[kind] = extra
    return out


def exchange(sender: RsocketsProcess, sfd: int, receiver: RsocketsProcess, rfd: int, data: bytes) -> None:
    """``data`` sent and received whole (a stream: the receiver reads until it has it all)."""
    sender.send(sfd, data)
    got = b""
    for _ in range(len(data) + 1):
        if len(got) >= len(data):
            break
        chunk = receiver.recv(rfd, len(data) - len(got))
        assert chunk, f"the connection ended after {len(got)} of {len(data)} bytes"
        got += chunk
    assert got == data


def ended(outcome: Mapping[str, Any]) -> bool:
    """A receive's outcome that says the connection ended: end of stream or an error (not a hang)."""
    return outcome.get("result") == "" or "error" in outcome


def brief(outcome: Mapping[str, Any]) -> Mapping[str, Any]:
    """An outcome to record: a hang without the kernel's listing and steps."""
    if "hang" not in outcome:
        return outcome
    return {"hang": {k: outcome["hang"].get(k) for k in ("call", "deadline", "cpu", "state")}}


def mapped(a: RsocketsProcess, b: RsocketsProcess, afd: int, cfd: int, length: int = PAGE,
           offset: int = 0) -> int:
    """A buffer of ``a`` mapped for writing on ``afd`` at ``offset``, its mapping carried to ``b`` (rsockets sends
    it with the next message)."""
    buf = a.alloc(length)
    assert a.iomap(afd, buf, offset) == offset
    exchange(a, afd, b, cfd, b"m")
    return buf


def placed(a: RsocketsProcess, afd: int, b: RsocketsProcess, cfd: int, data: bytes, offset: int = 0) -> None:
    """``b`` writes ``data`` at ``offset`` of ``a``'s mapping, then a message after it: once that is received,
    the write is placed."""
    outcome = b.iowrite(cfd, data, offset)
    assert outcome.get("result") == len(data), f"riowrite of {len(data)} bytes: {outcome}"
    exchange(b, cfd, a, afd, b"s")


@pytest.mark.san_rule("R9")
def test_send_and_receive_buffers_registered_once_per_connected_socket(rsockets: Spawn,
                                                                      request: pytest.FixtureRequest) -> None:
    """Each connected socket registers its send and receive buffers when it connects (two regions of at least
    128 KiB each end), and messages register nothing more."""
    a, b = rsockets(0), rsockets(1)
    before_a, before_b = held(a), held(b)
    _, afd, cfd = connected(a, b)
    at_connect = {"accepting": new_mrs(held(a), before_a), "connecting": new_mrs(held(b), before_b)}
    record(request, mrs=at_connect)
    for end, mrs in at_connect.items():
        big = [m["length"] for m in mrs if m["length"] >= BUFFER]
        assert len(big) == 2, f"the {end} socket's MRs at connect: {mrs} (send and receive buffers: two of >= {BUFFER})"
    for size in (1, 1000, 64 * 1024):
        exchange(b, cfd, a, afd, bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        exchange(a, afd, b, cfd, b"y" * size)
    after = {"accepting": new_mrs(held(a), before_a), "connecting": new_mrs(held(b), before_b)}
    for end in at_connect:
        assert after[end] == at_connect[end], f"the {end} socket registered per message: {after[end]}"


@pytest.mark.san_rule("R9")
def test_exactly_two_regions_per_connected_socket(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """A WSD switch registers two regions per connected socket; rsockets three (a declared deviation,
    ``deviations.py``: if it ever registers two, the report says the deviation was not observed)."""
    a, b = rsockets(0), rsockets(1)
    before = held(b)
    connected(a, b)
    mrs = new_mrs(held(b), before)
    record(request, mrs=mrs)
    assert len(mrs) == 2, f"the connected socket holds {len(mrs)} MRs: {[m['length'] for m in mrs]} bytes"


@pytest.mark.san_rule("R11")
def test_rclose_releases_what_the_socket_holds(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """After ``rclose`` at either end, the kernel holds no MR, QP, CQ or CM id the connection made."""
    a, b = rsockets(0), rsockets(1)
    before_b = held(b)
    listener, afd, cfd = connected(a, b)
    before_a = held(a)  # the listener's CM id stays; the accepted socket's objects must go
    exchange(b, cfd, a, afd, b"hello")
    for p, fd in ((b, cfd), (a, afd)):
        outcome = p.close(fd)
        assert "result" in outcome, f"rclose: {outcome}"
    after_b, after_a = left(held(b), before_b), held(a)
    accepted_left = {k: v for k, v in left(after_a, {"cm_id": before_a.get("cm_id", [])}).items()}
    record(request, connecting=after_b, accepting=accepted_left)
    assert not after_b, f"after rclose the connecting process still holds {after_b}"
    assert not accepted_left, f"after rclose the accepting process still holds {accepted_left}"
    a.close(listener)


@pytest.mark.san_rule("R11")
def test_rclose_with_riowrites_in_flight_releases_everything(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """The writer closes right after its ``riowrite``s returned (they are posted, perhaps not yet placed)."""
    a, b = rsockets(0), rsockets(1)
    before_b = held(b)
    _, afd, cfd = connected(a, b)
    mapped(a, b, afd, cfd, length=BUFFER)
    for i in range(4):
        outcome = b.iowrite(cfd, bytes([i]) * (BUFFER // 4), i * (BUFFER // 4))
        assert "result" in outcome, f"riowrite {i}: {outcome}"
    outcome = b.close(cfd)
    assert "result" in outcome, f"rclose with riowrites in flight: {outcome}"
    rest = left(held(b), before_b)
    record(request, left=rest)
    assert not rest, f"after rclose with riowrites in flight the writer still holds {rest}"


@pytest.mark.san_rule("R11")
def test_rclose_with_a_live_riomap_releases_everything(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """``rclose`` of a connected socket whose memory is still mapped must return, having deregistered the
    mapping and released the connection."""
    a, b = rsockets(0), rsockets(1)
    _, afd, cfd = connected(a, b)
    before = held(a)
    buf = mapped(a, b, afd, cfd)
    mapping = new_mrs(held(a), before)
    outcome = a.close(afd, deadline=15.0)
    if "hang" in outcome:
        record(request, hang={k: v for k, v in outcome["hang"].items() if k != "steps"})
        pytest.fail(f"R11: rclose of a connected socket with a live riomap (buffer {buf}, MR {mapping}) "
                    f"{describe_hang(outcome['hang'])}", pytrace=False)
    assert "result" in outcome, f"rclose: {outcome}"
    rest = [m for m in held(a).get("mr", []) if m.get("mrn") in {x.get("mrn") for x in mapping}]
    assert not rest, f"after rclose the mapping's MR is still registered: {rest}"


@pytest.mark.san_rule("R11")
def test_nothing_left_when_the_processes_exit(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """Both processes exit with a connection, a mapping and messages in place, closing nothing: the kernel then
    holds nothing of theirs, not even objects of a thread that ended."""
    a, b = rsockets(0), rsockets(1)
    _, afd, cfd = connected(a, b)
    mapped(a, b, afd, cfd)
    exchange(b, cfd, a, afd, b"bye")
    ends = {"accepting": a.process.exit(), "connecting": b.process.exit()}
    record(request, exits=ends)
    for end, outcome in ends.items():
        assert "hang" not in outcome, f"the {end} process did not exit: {describe_hang(outcome['hang'])}"
        rest = {k: v for k, v in outcome["held"].items() if v and k != "unowned"}
        assert not rest, f"after the {end} process exited the kernel still holds {rest}"
        assert not outcome["held"].get("unowned"), (f"after the {end} process exited the kernel holds objects of "
                                                    f"no thread: {outcome['held']['unowned']}")


@pytest.mark.san_rule("R3")
def test_peer_cannot_write_after_riounmap(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """Once ``riounmap`` returned, a peer's ``riowrite`` at the old offset places nothing there.

    The write is over when the memory is read: the writer's connection ended because of it, or a message the
    writer sent after it reached the mapping's end, or that end's connection ended. Which end learns that the
    refused write broke the connection is recorded, not judged: one of them is never told (its ``rrecv``
    blocks; the mapping's end on rxe, the writer on siw)."""
    a, b = rsockets(0), rsockets(1)
    _, afd, cfd = connected(a, b)
    buf = mapped(a, b, afd, cfd)
    placed(a, afd, b, cfd, b"before")
    assert a.peek(buf, 6) == b"before"
    a.iounmap(afd, buf)
    write = b.iowrite(cfd, b"after!", 0)
    b.process.call("send", {"fd": cfd, "data": S}, 30.0)
    waiting = a.process.start("recv", {"fd": afd, "length": 1})
    writer = b.process.call("recv", {"fd": cfd, "length": 1}, 30.0)
    mapping_end: Mapping[str, Any] = {"still waiting": "rrecv"}
    if not ended(writer):
        mapping_end = a.process.finish(waiting, "recv", 30.0)
        assert mapping_end.get("result") == S or ended(mapping_end), (
            "after the peer's riowrite to the unmapped offset nothing arrived and neither end's connection ended: "
            f"the writer's rrecv {brief(writer)}, the mapping end's {brief(mapping_end)}")
    record(request, write_after_unmap=write, writer_then=brief(writer), mapping_end_then=brief(mapping_end))
    assert a.peek(buf, 6) == b"before", "the peer's riowrite after riounmap landed in the unmapped memory"


@pytest.mark.san_rule("R4")
def test_peer_cannot_write_after_rclose(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """Once the mapping's socket is closed (``rclose``, in the background: it may not return), the peer sees the
    connection end and its ``riowrite`` places nothing."""
    a, b = rsockets(0), rsockets(1)
    _, afd, cfd = connected(a, b)
    buf = mapped(a, b, afd, cfd)
    placed(a, afd, b, cfd, b"before")
    closing = a.process.start("close", {"fd": afd})
    seen = b.process.call("recv", {"fd": cfd, "length": 1}, 30.0)
    assert ended(seen), f"the peer's receive after rclose: {seen}"
    write = b.iowrite(cfd, b"after!", 0)
    record(request, peer_saw=seen, write_after_close=write)
    assert a.peek(buf, 6) == b"before", f"the peer's riowrite after rclose landed ({write})"
    a.process.finish(closing, "close", 5.0)  # judged by the scenario of a live riomap; here only bounded


@pytest.mark.san_rule("R3")
def test_a_new_mapping_gets_a_new_rkey(rsockets: Spawn, request: pytest.FixtureRequest) -> None:
    """A mapping unmapped and another mapped at the same offset on the same connection: the new MR's rkey is not
    the old one's, and the peer's write lands in the new memory only."""
    a, b = rsockets(0), rsockets(1)
    _, afd, cfd = connected(a, b)
    before = held(a)
    first = mapped(a, b, afd, cfd)
    old = new_mrs(held(a), before)
    if not old or "rkey" not in old[0]:
        pytest.skip("the kernel shows this reader no keys (no CAP_NET_ADMIN)")
    a.iounmap(afd, first)
    second = mapped(a, b, afd, cfd, length=2 * PAGE)
    new = new_mrs(held(a), before)
    record(request, old=old, new=new)
    assert len(old) == 1 and len(new) == 1, f"mappings: {old} then {new}"
    assert new[0]["rkey"] != old[0]["rkey"], f"the new mapping reuses rkey {old[0]['rkey']:#x}"
    placed(a, afd, b, cfd, b"second")
    assert a.peek(second, 6) == b"second"
    assert a.peek(first, 6) == bytes(6), "the write at the reused offset reached the unmapped buffer"


@pytest.mark.san_rule("R2")
def test_a_mapping_is_not_reachable_through_another_connection(rsockets: Spawn,
                                                               request: pytest.FixtureRequest) -> None:
    """Two connections between the same processes: what one maps, a write through the other does not reach.
    rsockets keeps one PD per process, so the kernel would honour the rkey through either QP: the mapping is
    guarded by each connection's own table of the peer's mappings (offsets), which is all the peer can name."""
    a, b = rsockets(0), rsockets(1)
    listener = a.socket(SLOTS)
    where = a.listen(listener)
    a1, b1 = another(a, b, listener, where)
    a2, b2 = another(a, b, listener, where)
    buf = mapped(a, b, a1, b1)
    exchange(a, a2, b, b2, b"m")
    write = b.iowrite(b2, b"other!", 0)
    exchange(b, b2, a, a2, b"s")
    kernel = held(a)
    pds = sorted({q.get("pdn") for q in kernel.get("qp", [])} | {m.get("pdn") for m in kernel.get("mr", [])})
    record(request, write_through_other=write, pds_of_qps_and_mrs=pds)
    assert a.peek(buf, 6) == bytes(6), "a write through another connection reached the mapping"
    assert write.get("result") == 0 or "error" in write, (f"riowrite through another connection, to what it never "
                                                          f"mapped: {write}")
