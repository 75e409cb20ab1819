"""The verbs engine (hil/agent/engines/verbs) on a real RDMA device, and its host-side parts anywhere.

Tests marked ``rdma`` need an RDMA device (Soft-RoCE in a guest does: see shared/LAB.md) and an
interpreter with pyverbs (Debian's python3-pyverbs is for /usr/bin/python3); without them they are
SKIPPED with the reason -- they never pass silently. The rest (proxy, protocol, device selection
without a device, the agent's Python 3.9 / standard-library constraints) run everywhere.

In a guest: ``SAN_VERBS_RESULTS=/tmp/results.txt pytest tests/hil/agent/test_verbs_engine.py -v`` also writes
what each rule check observed; ``SAN_REQUIRE_RDMA=1`` turns the skips into an error (CI runs it so, in the
first lab guest, through ``san-hil lab ssh``).
"""

from __future__ import annotations

import ast
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.agent.engines.verbs import host, quirks
from hil.agent.engines.verbs.child import serve
from hil.rpc.codec import Opaque
from pytest_san.spi.contract import (
    DESCRIPTOR_SIZE,
    DO_DIRECT_IO,
    MAX_SGE,
    PAGE_SIZE,
    QUEUE_DEPTH,
    RDMA_THRESHOLD,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    Access,
    CacheType,
    SanError,
    Status,
    WsaError,
)

VERBS_DIR = Path(__file__).resolve().parents[3] / "hil" / "agent" / "engines" / "verbs"
SYSFS = "/sys/class/infiniband"
DATA = bytes(range(256)) * 16  # 4 KiB
GUARD = 64
WAIT = 60.0  # Soft-RoCE under TCG is slow: generous per-operation timeouts


def _rdma_skip_reason() -> str | None:
    if not os.path.isdir(SYSFS):
        return "no RDMA device: /sys/class/infiniband is absent"
    if not os.listdir(SYSFS):
        return "no RDMA device: /sys/class/infiniband is empty"
    if host.pyverbs_python() is None:
        return "pyverbs not importable"
    try:
        host.select_device(os.environ.get("SAN_DEVICE"))
    except host.NoRdmaDevice as exc:
        return str(exc)
    return None


RDMA_SKIP = _rdma_skip_reason()
if RDMA_SKIP is not None and os.environ.get("SAN_REQUIRE_RDMA"):  # CI in a lab guest: a skip would hide a failure
    raise RuntimeError(f"SAN_REQUIRE_RDMA is set but the device tests cannot run: {RDMA_SKIP}")
rdma = pytest.mark.skipif(RDMA_SKIP is not None, reason=RDMA_SKIP or "")


def record(rule: str, text: str) -> None:
    """What a rule check observed, for the lab report (only when SAN_VERBS_RESULTS names a file)."""
    path = os.environ.get("SAN_VERBS_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(f"{rule}\t{text}\n")


# -- fixtures (RDMA) ------------------------------------------------------------------------------


class Lab:
    def __init__(self) -> None:
        self.device, self.port = host.select_device(os.environ.get("SAN_DEVICE"))
        self.netdev, self.address = host.device_address(self.device, self.port, os.environ.get("SAN_NETDEV"))
        python = host.pyverbs_python()
        assert python is not None
        self.python = python
        self.driver = quirks.driver_of(self.device)
        self.workarounds = {w.name for w in quirks.applied(self.driver)}
        # rxe before 6.12 ends a send's wait on its own after about 2 s, CONNECTION_RESET (the model's
        # send-wait-bounded; `san-hil lab reproduce rxe-send-wait-bounded`)
        self.wait_bounded = self.driver == "rxe" and (quirks.kernel_series(os.uname().release) or (0, 0)) < (6, 12)


@pytest.fixture(scope="module")
def lab() -> Lab:
    return Lab()


@pytest.fixture(scope="module")
def idle(lab: Lab) -> Iterator[dict[str, list[host.ChildProcess]]]:
    """Children a test left alive, reset, by mw_mode: the next tests take them (a pyverbs child costs about
    10 s of CPU to start in a TCG guest; the agent keeps its default process across tests the same way)."""
    pool: dict[str, list[host.ChildProcess]] = {}
    yield pool
    for child in [c for children in pool.values() for c in children]:
        child.close()
        assert child.returncode == 0, child.stderr_tail()


@pytest.fixture
def spawn(lab: Lab, idle: dict[str, list[host.ChildProcess]]) -> Iterator[Callable[..., host.ChildProcess]]:
    children: list[tuple[str, host.ChildProcess]] = []

    def make(mw_mode: str = "auto") -> host.ChildProcess:
        free = idle.get(mw_mode, [])
        child = free.pop() if free else host.ChildProcess(lab.device, lab.port, lab.address, python=lab.python,
                                                          mw_mode=mw_mode)
        children.append((mw_mode, child))
        return child

    yield make
    for mw_mode, child in children:
        if child.alive:
            child.call("reset")  # closes the sockets the test left open, releasing their registrations
            leaks = child.call("leaks")
            assert leaks == [], leaks
            idle.setdefault(mw_mode, []).append(child)


def connect(a: host.ChildProcess, b: host.ChildProcess) -> tuple[int, int]:
    """A connected socket pair, as the controller makes one: b listens, a connects to the address and
    port b gave (through the RDMA connection manager; b's child accepts by itself)."""
    sb, where = b.socket_listen()
    sa = a.socket_connect(where)
    return sa, sb


class Guarded:
    """``length`` bytes with GUARD bytes of 0xEE on each side, in one child's buffer."""

    def __init__(self, child: host.ChildProcess, length: int, fill: bytes = b"\0") -> None:
        self.child = child
        base, _ = child.alloc(length + 2 * GUARD)
        self.base = base
        self.address = base + GUARD
        self.length = length
        child.write(base, b"\xee" * GUARD + (fill * length)[:length] + b"\xee" * GUARD)
        self.initial = child.read(self.address, length)

    def read(self) -> bytes:
        return self.child.read(self.address, self.length)

    def intact(self) -> bool:
        raw = self.child.read(self.base, self.length + 2 * GUARD)
        return raw[:GUARD] == b"\xee" * GUARD and raw[-GUARD:] == b"\xee" * GUARD

    def unchanged(self) -> bool:
        return self.intact() and self.read() == self.initial


def source(child: host.ChildProcess, sock: int, data: bytes, access: int = Access.READ) -> tuple[int, int]:
    address, _ = child.alloc(len(data))
    child.write(address, data)
    handle = child.call("register_memory", socket=sock, address=address, length=len(data), access=access)
    return address, handle


def window(child: host.ChildProcess, sock: int, length: int, access: int,
           fill: bytes = b"\0") -> tuple[Guarded, bytes]:
    target = Guarded(child, length, fill)
    desc = child.call("register_rdma_memory", socket=sock, address=target.address, length=length, access=access)
    return target, desc


def wait(child: host.ChildProcess, op: int, timeout: float = WAIT) -> dict[str, int]:
    """{"status", "bytes"} of the operation (the contract's completion)."""
    done = wait_raw(child, op, timeout)
    return {"status": done["status"], "bytes": done["bytes"]}


def write(child: host.ChildProcess, sock: int, address: int, handle: int, desc: bytes, length: int = len(DATA),
          offset: int = 0, raw: bool = False) -> dict[str, Any]:
    """RDMA-write ``length`` bytes at ``address`` (registered as ``handle``) into ``desc``: its completion
    (``raw``: with the ibv_wc_status, as ``wait_raw``)."""
    op = child.call("rdma_write", socket=sock, buffers=[[address, length, handle]], descriptor=desc, offset=offset)
    return (wait_raw if raw else wait)(child, op)


def wait_raw(child: host.ChildProcess, op: int, timeout: float = WAIT) -> dict[str, Any]:
    """... plus "wc_status", the raw ibv_wc_status (None when the provider refused in software)."""
    return child.op_wait(op, timeout)


# rxe reports an lkey it cannot use (another PD's, or a deregistered one) as IBV_WC_LOC_QP_OP_ERR (2:
# copy_data() fails with -EINVAL, not -EFAULT); hardware HCAs report IBV_WC_LOC_PROT_ERR (4). Both are
# local errors the contract does not tell apart from its table: 4 is LOCAL_PROTECTION, 2 is not in
# the table and so becomes REMOTE_OPERATION. Either way nothing moves and the QP is in ERR.
BAD_LKEY_WC = (4, 2)


def lkey_refused(lab: Lab, done: dict[str, Any]) -> bool:
    """A transfer naming an lkey its socket cannot use failed and moved nothing: on the NIC (a wc status of
    BAD_LKEY_WC), or, where rxe-flushed-local-error applies, refused by the engine before posting
    (LOCAL_PROTECTION, 0 bytes, no wc)."""
    if "rxe-flushed-local-error" in lab.workarounds:
        return (done["status"], done["bytes"], done["wc_status"]) == (Status.LOCAL_PROTECTION.value, 0, None)
    return done["status"] != Status.SUCCESS.value and done["wc_status"] in BAD_LKEY_WC


def refused(child: host.ChildProcess, done: dict[str, Any]) -> bool:
    """The responder refused the transfer: REM_ACCESS_ERR (ACCESS_VIOLATION) on IB/RoCE. iWARP has no
    such completion: the responder ends the connection, and the initiator's operation completes with an
    error (ACCESS_VIOLATION when its fence read is flushed, else the flush or the connection's end)."""
    if child.hello["transport"] == "iwarp":
        return done["status"] != Status.SUCCESS.value and done["bytes"] == 0
    return done["status"] == Status.ACCESS_VIOLATION.value


def needs_rnr(child: host.ChildProcess) -> None:
    """Skip where a send cannot wait for the peer's receive: iWARP has no receiver-not-ready flow control
    (a send without a posted receive ends the connection)."""
    if child.hello["transport"] == "iwarp":
        pytest.skip("iWARP has no RNR: a send cannot wait for the peer's receive")


def san_error(call: Callable[[], Any]) -> SanError:
    with pytest.raises(SanError) as err:
        call()
    return err.value


# -- the engine on a real device -----------------------------------------------------------------------


@rdma
def test_child_opens_the_device_with_its_capabilities(spawn: Callable[..., host.ChildProcess], lab: Lab) -> None:
    a = spawn()
    hello = a.hello
    assert hello["device"] == lab.device and hello["pid"] == a.pid and hello["address"] == lab.address
    assert hello["transport"] in ("ib", "iwarp") and 1 <= hello["max_sge_rd"] <= hello["max_sge"]
    # Windows where the device has type-2 ones, else plain MRs: "memory_windows" claimed only with them.
    assert hello["mw_mode"] == ("mw2" if hello["device_has_mw2"] else "mr")
    assert ("memory_windows" in host.host_capabilities(host.PinnedProxy(), hello)) == hello["device_has_mw2"]
    # A send waits for the peer's receive on IB and RoCE (RNR retry); iWARP ends the connection instead.
    caps = host.host_capabilities(host.PinnedProxy(), hello)
    assert ("send_waits" in caps) == (hello["transport"] == "ib") == ("iwarp" not in caps)
    # The model's one-buffer-read alternative follows the device's max_sge_rd (siw: 1), never its name.
    assert ("rdma_read_scatter" in caps) == (hello["max_sge_rd"] >= MAX_SGE)
    record("DEVICE", f"device {lab.device} on {lab.netdev} {lab.address} enums {hello['enums']}: transport "
                     f"{hello['transport']}, mw_mode {hello['mw_mode']}, max_sge {hello['max_sge']}, max_sge_rd "
                     f"{hello['max_sge_rd']}, MTU enum {hello['mtu']}, atomic_cap {hello['atomic_cap']}")


@rdma
def test_connection_manager_connects_by_address_and_port(spawn: Callable[..., host.ChildProcess], lab: Lab) -> None:
    a, b = spawn(), spawn()
    t0 = time.monotonic()
    sb, where = b.socket_listen()
    assert where["address"] == lab.address and isinstance(where["port"], int)
    sa = a.socket_connect(where)  # returns connected: b's child accepted while no request reached it
    took = time.monotonic() - t0
    assert a.call("socket_state", socket=sa) == "connected"
    assert b.call("socket_state", socket=sb) == "connected"
    # One connection per listening socket: its port is free again once it accepted.
    again = san_error(lambda: a.socket_connect(where))
    assert again.code == WsaError.WSAEINVAL
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, len(DATA), Access.WRITE)
    assert write(a, sa, src, h, desc) == {"status": Status.SUCCESS.value, "bytes": len(DATA)}
    assert target.read() == DATA and target.intact()
    # A process connected to itself: its one child is both ends.
    sl, where_self = a.socket_listen()
    sc = a.socket_connect(where_self)
    assert {a.call("socket_state", socket=s) for s in (sl, sc)} == {"connected"}
    record("CM", f"listen {where} -> connected in {took:.2f}s; a second connect to it: {again}; a process "
                 "connected to itself")


@rdma
def test_peer_close_and_death_reach_the_survivor_through_cm(spawn: Callable[..., host.ChildProcess]) -> None:
    """No relay: the survivor learns from CM's DISCONNECTED event that its peer closed or died."""
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    rbuf, _ = b.alloc(4096)
    hr = b.call("register_memory", socket=sb, address=rbuf, length=4096, access=Access.WRITE)
    recv = b.call("recv", socket=sb, buffers=[[rbuf, 4096, hr]])
    a.call("close_socket", socket=sa)
    assert wait(b, recv)["status"] == Status.CONNECTION_RESET.value
    assert b.call("socket_state", socket=sb) == "disconnected"
    assert san_error(lambda: b.call("recv", socket=sb, buffers=[[rbuf, 4096, hr]])).code == WsaError.WSAENOTCONN
    c, d = spawn(), spawn()
    sc, _sd = connect(c, d)
    cbuf, _ = c.alloc(4096)
    hc = c.call("register_memory", socket=sc, address=cbuf, length=4096, access=Access.WRITE)
    recv_c = c.call("recv", socket=sc, buffers=[[cbuf, 4096, hc]])
    d.kill()  # the kernel tears its connection down: CM tells c
    assert wait(c, recv_c)["status"] == Status.CONNECTION_RESET.value
    assert c.call("socket_state", socket=sc) == "disconnected"
    record("R4", "peer closed, peer killed: the survivor's pending receive CONNECTION_RESET from CM's DISCONNECTED, "
                 "no relay")


@rdma
def test_rdma_write_read_send_recv_succeed(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, len(DATA), Access.WRITE)
    done = write(a, sa, src, h, desc)
    assert done == {"status": Status.SUCCESS.value, "bytes": len(DATA)}
    assert target.read() == DATA and target.intact()
    # RdmaRead of a READ window into a WRITE handle, gathered in two pieces where the device scatters a read
    # into two (max_sge_rd); where it does not (siw: 1), two buffers are "too many buffers" at the call.
    _exposed, rdesc = window(b, sb, len(DATA), Access.READ, fill=b"r")
    sink, _ = a.alloc(len(DATA))
    hs = a.call("register_memory", socket=sa, address=sink, length=len(DATA), access=Access.WRITE)
    half = len(DATA) // 2
    two = [[sink, half, hs], [sink + half, half, hs]]
    if a.hello["max_sge_rd"] >= 2:
        done = wait(a, a.call("rdma_read", socket=sa, buffers=two, descriptor=rdesc, offset=0))
    else:
        refused = san_error(lambda: a.call("rdma_read", socket=sa, buffers=two, descriptor=rdesc, offset=0))
        assert refused.code == WsaError.WSAEINVAL and "at most 1" in str(refused)
        done = wait(a, a.call("rdma_read", socket=sa, buffers=[[sink, len(DATA), hs]], descriptor=rdesc, offset=0))
    assert done == {"status": Status.SUCCESS.value, "bytes": len(DATA)}
    assert a.read(sink, len(DATA)) == b"r" * len(DATA)
    # A message: the receive is posted first or after; both complete with the byte count.
    rbuf, _ = b.alloc(8192)
    hr = b.call("register_memory", socket=sb, address=rbuf, length=8192, access=Access.READWRITE)
    recv = b.call("recv", socket=sb, buffers=[[rbuf, 8192, hr]])
    send = a.call("send", socket=sa, buffers=[[src, 100, h]])
    assert wait(a, send) == {"status": 0, "bytes": 100}
    assert wait(b, recv) == {"status": 0, "bytes": 100}
    assert b.read(rbuf, 100) == DATA[:100]
    if a.hello["transport"] != "iwarp":  # iWARP has no RNR: a send without a posted receive ends the connection
        send = a.call("send", socket=sa, buffers=[[src + 100, 50, h]])
        time.sleep(0.2)
        assert not a.call("op_done", op_id=send)  # no receive posted yet: the send waits (RNR), as in the contract
        recv = b.call("recv", socket=sb, buffers=[[rbuf, 8192, hr]])
        assert wait(a, send)["status"] == 0 and wait(b, recv) == {"status": 0, "bytes": 50}
    # A zero-byte message (empty scatter lists, or only zero-length entries): a work request of no SGE at all
    # (the SPI fuzz on siw found pyverbs refusing one), then the connection still carries data.
    for send_list, recv_list in (([], []), ([[src, 0, h]], [[rbuf, 0, hr]])):
        recv = b.call("recv", socket=sb, buffers=recv_list)
        send = a.call("send", socket=sa, buffers=send_list)
        assert wait(a, send) == {"status": 0, "bytes": 0} and wait(b, recv) == {"status": 0, "bytes": 0}
    recv = b.call("recv", socket=sb, buffers=[[rbuf, 8192, hr]])
    assert wait(a, a.call("send", socket=sa, buffers=[[src, 10, h]])) == {"status": 0, "bytes": 10}
    assert wait(b, recv) == {"status": 0, "bytes": 10} and b.read(rbuf, 10) == DATA[:10]
    a.call("close_socket", socket=sa)
    b.call("close_socket", socket=sb)


@rdma
def test_r1_handle_from_another_process_is_refused(lab: Lab, spawn: Callable[..., host.ChildProcess]) -> None:
    a, b, c = spawn(), spawn(), spawn()
    sa, _sb = connect(a, b)
    sc, sb2 = connect(c, b)
    _, handle = source(a, sa, DATA)  # a's handle (its lkey, in a's PD)
    target, desc = window(b, sb2, len(DATA), Access.WRITE)
    mine, _ = c.alloc(len(DATA))
    c.write(mine, b"\x77" * len(DATA))
    done = write(c, sc, mine, handle, desc, raw=True)
    assert lkey_refused(lab, done), done  # the NIC: another PD
    assert target.unchanged()
    # iWARP: the local error ends the connection too, and CM's DISCONNECTED may already have said so.
    assert c.call("socket_state", socket=sc) in (("error", "disconnected") if c.hello["transport"] == "iwarp"
                                                 else ("error",))
    record("R1", f"foreign lkey {handle:#x} used by another process: wc_status {done['wc_status']} -> status "
                 f"{done['status']}, target unchanged, initiator QP in ERR")


@rdma
def test_r1_handle_on_another_socket_of_the_same_process_is_refused(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, _sb = connect(a, b)
    sa2, sb2 = connect(a, b)
    src, handle = source(a, sa, DATA)
    target, desc2 = window(b, sb2, len(DATA), Access.WRITE)
    done = write(a, sa2, src, handle, desc2)
    assert done["status"] == Status.LOCAL_PROTECTION.value
    assert target.unchanged()
    record("R1", f"handle of socket {sa} used on socket {sa2} of the same process: status {done['status']} "
                 "(refused in software; the NIC would refuse it too: another socket's PD)")


@rdma
@pytest.mark.parametrize("mw_mode", ["auto", "mr"])
def test_r2_descriptor_through_another_connection_is_rejected(spawn: Callable[..., host.ChildProcess],
                                                              mw_mode: str) -> None:
    """With windows (bound to the socket's QP) or plain MRs (in the socket's own PD, which the NIC checks
    against the QP's): a descriptor works through its own connection only."""
    a, b, c = spawn(), spawn(mw_mode=mw_mode), spawn()
    sa, sb = connect(a, b)
    sa2, _sb2 = connect(a, b)  # a second connection between the same two processes
    sc, _sb3 = connect(c, b)  # and one from a third process
    target, desc = window(b, sb, len(DATA), Access.READWRITE)  # bound to sb's QP / in sb's PD
    src, h2 = source(a, sa2, DATA)
    done = write(a, sa2, src, h2, desc)
    assert refused(a, done), done
    assert target.unchanged()
    csrc, hc = source(c, sc, DATA)
    done_c = write(c, sc, csrc, hc, desc)
    assert refused(c, done_c), done_c
    assert target.unchanged()
    # The connected peer, on that connection, may use it.
    src1, h1 = source(a, sa, DATA)
    done_ok = write(a, sa, src1, h1, desc)
    assert done_ok == {"status": 0, "bytes": len(DATA)}
    assert target.read() == DATA and target.intact()
    sa4, _sb4 = connect(a, b)  # sa2 is in ERR after its violation
    outcome, landed = _read_through(a, sa4, desc)
    assert refused(a, outcome) and landed.unchanged()
    record("R2", f"{b.hello['mw_mode']} rkey used through another QP of the same processes: status {done['status']}; "
                 f"from a third process: {done_c['status']}; read through another QP: {outcome['status']}; through "
                 f"its own QP: {done_ok['status']}")


def _read_through(child: host.ChildProcess, sock: int, desc: bytes) -> tuple[dict[str, int], Guarded]:
    """An RDMA read of the whole descriptor into a fresh WRITE handle of ``child``: (completion, sink)."""
    sink = Guarded(child, len(DATA), b"\x11")
    h = child.call("register_memory", socket=sock, address=sink.address, length=len(DATA), access=Access.WRITE)
    op = child.call("rdma_read", socket=sock, buffers=[[sink.address, len(DATA), h]], descriptor=desc, offset=0)
    return wait(child, op), sink


@rdma
def test_r3_deregistered_window_and_handle_are_rejected(lab: Lab, spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, len(DATA), Access.WRITE)
    b.call("deregister_rdma_memory", socket=sb, descriptor=desc)
    assert b.call("registrations", socket=sb) == []
    done = write(a, sa, src, h, desc)
    assert refused(a, done), done
    assert target.unchanged()
    # A deregistered handle: its lkey is gone from the NIC too.
    a2, b2 = spawn(), spawn()
    sa2, sb2 = connect(a2, b2)
    src2, h2 = source(a2, sa2, DATA)
    target2, desc2 = window(b2, sb2, len(DATA), Access.WRITE)
    a2.call("deregister_memory", socket=sa2, handle=h2)
    done2 = write(a2, sa2, src2, h2, desc2, raw=True)
    assert lkey_refused(lab, done2), done2
    assert target2.unchanged()
    record("R3", f"after IBV_WR_LOCAL_INV + dealloc: peer write status {done['status']}; "
                 f"deregistered handle (dead lkey): wc_status {done2['wc_status']} -> {done2['status']}")


@rdma
def test_r6_read_only_is_never_written(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, len(DATA), Access.READ, fill=b"k")
    done = write(a, sa, src, h, desc)
    assert done["status"] == Status.ACCESS_VIOLATION.value == 10, done
    assert target.unchanged()
    # Local half: a READ handle is neither a receive buffer nor an RdmaRead sink.
    a2, b2 = spawn(), spawn()
    sa2, _sb2 = connect(a2, b2)
    buf, hread = source(a2, sa2, b"\0" * 4096)
    recv = wait(a2, a2.call("recv", socket=sa2, buffers=[[buf, 4096, hread]]))
    assert recv["status"] == Status.LOCAL_PROTECTION.value
    a3, b3 = spawn(), spawn()
    sa3, sb3 = connect(a3, b3)
    _, rdesc = window(b3, sb3, 4096, Access.READ, fill=b"z")
    sink = Guarded(a3, 4096)
    hsink = a3.call("register_memory", socket=sa3, address=sink.address, length=4096, access=Access.READ)
    rd = wait(a3, a3.call("rdma_read", socket=sa3, buffers=[[sink.address, 4096, hsink]], descriptor=rdesc, offset=0))
    assert rd["status"] == Status.LOCAL_PROTECTION.value
    assert sink.unchanged()
    record("R6", f"RDMA write into a READ window: status {done['status']} (REM_ACCESS_ERR), guards and bytes "
                 f"unchanged; READ handle as recv buffer: {recv['status']}; as RdmaRead sink: {rd['status']}")


@rdma
def test_r7_write_only_is_never_read(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    _, desc = window(b, sb, 4096, Access.WRITE, fill=b"s")  # secret
    sink = Guarded(a, 4096)
    hs = a.call("register_memory", socket=sa, address=sink.address, length=4096, access=Access.WRITE)
    rd = wait(a, a.call("rdma_read", socket=sa, buffers=[[sink.address, 4096, hs]], descriptor=desc, offset=0))
    assert rd["status"] == Status.ACCESS_VIOLATION.value, rd
    assert sink.unchanged()
    # Local half, kept in software: a WRITE handle is no send / RdmaWrite source.
    a2, b2 = spawn(), spawn()
    sa2, sb2 = connect(a2, b2)
    src, hw = source(a2, sa2, DATA, access=Access.WRITE)
    rbuf, _ = b2.alloc(8192)
    hr = b2.call("register_memory", socket=sb2, address=rbuf, length=8192, access=Access.WRITE)
    recv = b2.call("recv", socket=sb2, buffers=[[rbuf, 8192, hr]])
    send = wait(a2, a2.call("send", socket=sa2, buffers=[[src, 100, hw]]))
    assert send["status"] == Status.LOCAL_PROTECTION.value
    time.sleep(0.5)
    if a2.hello["transport"] == "iwarp":  # the refusal's QP error ends the connection: the receive ends, empty
        assert wait(b2, recv)["bytes"] == 0 and b2.read(rbuf, 100) == b"\0" * 100
    else:
        assert not b2.call("op_done", op_id=recv)  # nothing arrived
    a3, b3 = spawn(), spawn()
    sa3, sb3 = connect(a3, b3)
    src3, hw3 = source(a3, sa3, DATA, access=Access.WRITE)
    target3, desc3 = window(b3, sb3, len(DATA), Access.WRITE)
    wr = write(a3, sa3, src3, hw3, desc3)
    assert wr["status"] == Status.LOCAL_PROTECTION.value
    assert target3.unchanged()
    record("R7", f"RDMA read from a WRITE window: status {rd['status']}; WRITE handle as send source: "
                 f"{send['status']}, as RdmaWrite source: {wr['status']} (software)")


@rdma
def test_r8_bounds_are_enforced_by_the_window(spawn: Callable[..., host.ChildProcess]) -> None:
    seen = []
    for offset, length in ((1, 4096), (4096, 1), (-1, 16)):
        a, b = spawn(), spawn()
        sa, sb = connect(a, b)
        src, h = source(a, sa, DATA)
        target, desc = window(b, sb, 4096, Access.WRITE)
        done = write(a, sa, src, h, desc, length=length, offset=offset)
        assert done["status"] == Status.ACCESS_VIOLATION.value, (offset, length, done)
        assert target.unchanged()
        seen.append(f"offset {offset} + {length} into 4096: {done['status']}")
        a.close()
        b.close()
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, 4096, Access.WRITE)
    done = write(a, sa, src, h, desc, length=96, offset=4000)
    assert done == {"status": 0, "bytes": 96}
    assert target.read()[4000:] == DATA[:96] and target.intact()
    record("R8", "; ".join(seen) + "; in bounds (4000 + 96): 0")


@rdma
def test_r11_close_aborts_pending_and_releases_everything(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, _sb = connect(a, b)
    rbuf, _ = a.alloc(4096)
    hr = a.call("register_memory", socket=sa, address=rbuf, length=4096, access=Access.WRITE)
    window(a, sa, 4096, Access.READWRITE)
    recv = a.call("recv", socket=sa, buffers=[[rbuf, 4096, hr]])
    err = san_error(lambda: a.call("deregister_memory", socket=sa, handle=hr))  # in use by the receive
    assert err.code == WsaError.WSAEINVAL
    assert len(a.call("registrations", socket=sa)) == 2
    a.call("close_socket", socket=sa)
    done = wait_raw(a, recv)
    assert done["status"] == Status.ABORTED.value, done
    assert a.call("registrations", socket=sa) == []
    assert a.call("leaks") == []
    assert san_error(lambda: a.call("register_memory", socket=sa, address=rbuf, length=16, access=1)).code \
        == WsaError.WSAENOTSOCK
    record("R11", f"posted recv on close: wc_status {done['wc_status']} -> status {done['status']} (ABORTED); "
                  "registrations after close: [] ; leaks: []")


@rdma
def test_r13_reference_counting(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    h2 = a.call("register_memory", socket=sa, address=src, length=len(DATA), access=Access.READ)
    assert h2 == h
    assert a.call("registrations", socket=sa)[0]["refs"] == 2
    target, desc = window(b, sb, len(DATA), Access.WRITE)
    desc2 = b.call("register_rdma_memory", socket=sb, address=target.address, length=len(DATA), access=Access.WRITE)
    assert desc2 == desc
    a.call("deregister_memory", socket=sa, handle=h)
    b.call("deregister_rdma_memory", socket=sb, descriptor=desc)
    done = write(a, sa, src, h, desc)
    assert done == {"status": 0, "bytes": len(DATA)}  # one reference each is left: both still work
    a.call("deregister_memory", socket=sa, handle=h)
    b.call("deregister_rdma_memory", socket=sb, descriptor=desc)
    assert a.call("registrations", socket=sa) == [] and b.call("registrations", socket=sb) == []
    assert san_error(lambda: a.call("deregister_memory", socket=sa, handle=h)).code == WsaError.WSAEINVAL
    assert san_error(lambda: b.call("deregister_rdma_memory", socket=sb, descriptor=desc)).code == WsaError.WSAEINVAL
    record("R13", "same handle and same descriptor on re-registration; refs 2; first deregister keeps them "
                  "working; last releases; a third deregister: WSAEINVAL")


@rdma
def test_r14_error_codes(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, where = a.socket_listen()
    buf, _ = a.alloc(4096)
    assert san_error(lambda: a.call("register_memory", socket=sa, address=buf, length=4096, access=1)).code \
        == WsaError.WSAENOTCONN  # listening, not connected
    b.socket_connect(where)
    probe = san_error(lambda: a.call("register_rdma_memory", socket=sa, address=buf, length=4096, access=1,
                                     descriptor_size=4))
    assert probe.code == WsaError.WSAEFAULT and probe.required_size == DESCRIPTOR_SIZE == 20
    for access in (0, 4, 7):
        assert san_error(lambda: a.call("register_memory", socket=sa, address=buf, length=4096,
                                        access=access)).code == WsaError.WSAEINVAL  # noqa: B023
    assert san_error(lambda: a.call("register_memory", socket=sa, address=buf, length=4097, access=1)).code \
        == WsaError.WSAEFAULT  # runs into the guard page
    assert san_error(lambda: a.call("register_memory", socket=sa, address=buf, length=0, access=1)).code \
        == WsaError.WSAEFAULT
    assert san_error(lambda: a.call("register_memory", socket=sa, address=16, length=16, access=1)).code \
        == WsaError.WSAEFAULT
    assert san_error(lambda: a.call("register_memory", socket=999, address=buf, length=16, access=1)).code \
        == WsaError.WSAENOTSOCK
    assert san_error(lambda: a.call("deregister_memory", socket=sa, handle=12345)).code == WsaError.WSAEINVAL
    assert san_error(lambda: a.call("deregister_rdma_memory", socket=sa, descriptor=b"x" * 20)).code \
        == WsaError.WSAEINVAL
    h = a.call("register_memory", socket=sa, address=buf, length=4096, access=Access.READWRITE)
    assert san_error(lambda: a.call("rdma_write", socket=sa, buffers=[[buf, 16, h]], descriptor=b"short",
                                    offset=0)).code == WsaError.WSAEINVAL
    assert san_error(lambda: a.call("send", socket=sa, buffers=[[buf, 16, h]] * 5)).code == WsaError.WSAEINVAL
    assert a.call("getsockopt", socket=sa, option=SO_RDMA_THRESHOLD_SIZE) == RDMA_THRESHOLD
    assert a.call("getsockopt", socket=sa, option=SO_MAX_RDMA_SIZE) > 0
    assert san_error(lambda: a.call("getsockopt", socket=sa, option=1)).code == WsaError.WSAEINVAL
    ops = [a.call("recv", socket=sa, buffers=[[buf, 64, h]]) for _ in range(QUEUE_DEPTH)]
    assert san_error(lambda: a.call("recv", socket=sa, buffers=[[buf, 64, h]])).code == WsaError.WSAENETDOWN
    a.call("close_socket", socket=sa)
    assert {wait(a, op)["status"] for op in ops} == {Status.ABORTED.value}
    record("R14", "WSAENOTCONN while listening; descriptor_size 4 -> WSAEFAULT required_size 20; access 0/4/7 -> "
                  "WSAEINVAL; range over guard page / empty / unmapped -> WSAEFAULT; unknown socket -> WSAENOTSOCK; "
                  "unknown handle/descriptor -> WSAEINVAL; bad descriptor length, 5 SGEs -> WSAEINVAL; "
                  f"{QUEUE_DEPTH + 1}th recv -> WSAENETDOWN")


@rdma
def test_bad_input_is_refused_before_anything_changes(spawn: Callable[..., host.ChildProcess]) -> None:
    """CONTRACT.md section 4 on the device: wrong types, negative lengths and malformed scatter lists are refused at
    the call; nothing is registered, marked in use or moved, and the connection stays up."""
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, 16, Access.WRITE)
    for access in (True, 1.0, "1", None):
        assert san_error(lambda: a.call("register_memory", socket=sa, address=src, length=16,
                                        access=access)).code == WsaError.WSAEINVAL  # noqa: B023
    assert san_error(lambda: a.call("register_memory", socket=sa, address=src, length=-16, access=1)).code \
        == WsaError.WSAEINVAL
    assert san_error(lambda: a.call("register_rdma_memory", socket=sa, address=src, length=16, access=1,
                                    descriptor_size="20")).code == WsaError.WSAEINVAL
    for option in ("x", None, 1.5, float(SO_MAX_RDMA_SIZE)):
        assert san_error(lambda: a.call("getsockopt", socket=sa, option=option)).code == WsaError.WSAEINVAL  # noqa: B023
    regs = a.call("registrations", socket=sa)
    # A negative length inside the registered buffer: once it wrote far outside a 16-byte window.
    for buffers in ([[src + 64, -32, h]], [[src, 16, h], [src, 16]], [[src, 16, h], None], "x",
                    [[src, True, h]], [[src, 16.0, h]]):
        assert san_error(lambda: a.call("rdma_write", socket=sa, buffers=buffers,  # noqa: B023
                                        descriptor=desc, offset=0)).code == WsaError.WSAEINVAL
        assert san_error(lambda: a.call("rdma_read", socket=sa, buffers=buffers,  # noqa: B023
                                        descriptor=desc, offset=0)).code == WsaError.WSAEINVAL
    assert san_error(lambda: a.call("rdma_write", socket=sa, buffers=[[src, 16, h]], descriptor=desc,
                                    offset=True)).code == WsaError.WSAEINVAL
    # What the controller could not send as itself (a memoryview descriptor) reaches the engine as an Opaque:
    # the child refuses it as the emulator refuses the object (it once escaped as the agent's TypeError).
    for junk in (Opaque("<memory at 0x7f>"), object()):
        assert san_error(lambda j=junk: a.call("rdma_write", socket=sa, buffers=[[src, 16, h]], descriptor=j,
                                               offset=0)).code == WsaError.WSAEINVAL
        assert san_error(lambda j=junk: a.call("deregister_rdma_memory", socket=sa,
                                               descriptor=j)).code == WsaError.WSAEINVAL
    assert a.call("registrations", socket=sa) == regs and target.unchanged()
    assert a.call("socket_state", socket=sa) == "connected"
    # An offset that wraps the 64-bit address space names no byte of the window (offset 2**64 once read
    # its start): refused like any offset past the window, nothing moved.
    for kind in ("rdma_write", "rdma_read"):
        s1, s2 = connect(a, b)
        mine, h1 = source(a, s1, DATA, access=Access.READWRITE)
        theirs, desc2 = window(b, s2, 16, Access.READWRITE)
        done = wait(a, a.call(kind, socket=s1, buffers=[[mine, 1, h1]], descriptor=desc2, offset=1 << 64))
        assert done == {"status": Status.ACCESS_VIOLATION.value, "bytes": 0} and theirs.unchanged()
        assert a.read(mine, 1) == DATA[:1]
    a.call("deregister_memory", socket=sa, handle=h)  # never marked in use by a refused call
    h = a.call("register_memory", socket=sa, address=src, length=16, access=Access.READ)
    done = wait(a, a.call("rdma_write", socket=sa, buffers=[[src, 16, h], [src, 16, str(h)]], descriptor=desc,
                          offset=0))  # a handle that is no int is an unknown handle: refused, as the emulator does
    assert done == {"status": Status.LOCAL_PROTECTION.value, "bytes": 0} and target.unchanged()
    a.call("deregister_memory", socket=sa, handle=h)
    assert a.call("registrations", socket=sa) == []
    record("BAD-INPUT", "access True/1.0/'1'/None, negative length, descriptor_size '20', getsockopt 'x'/None, "
                    "malformed scatter lists, offset True -> WSAEINVAL at the call; nothing changed")


@rdma
def test_r4_peer_closed_or_killed_is_connection_reset(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, len(DATA), Access.WRITE)
    b.call("close_socket", socket=sb)
    try:
        done = write(a, sa, src, h, desc)
    except SanError as exc:  # CM's DISCONNECTED already reached a: not connected any more
        assert exc.code == WsaError.WSAENOTCONN
        done = {"status": Status.CONNECTION_RESET.value, "bytes": 0}
    assert done["status"] == Status.CONNECTION_RESET.value, done  # RETRY_EXC_ERR or the disconnect's flush
    assert target.unchanged()
    c, d = spawn(), spawn()
    sc, _sd = connect(c, d)
    rbuf, _ = c.alloc(4096)
    hr = c.call("register_memory", socket=sc, address=rbuf, length=4096, access=Access.WRITE)
    recv = c.call("recv", socket=sc, buffers=[[rbuf, 4096, hr]])
    d.kill()  # its registrations vanish with it
    assert not d.alive
    c.call("socket_peer_closed", socket=sc)  # the controller relays the loss
    assert wait(c, recv)["status"] == Status.CONNECTION_RESET.value
    assert c.call("socket_state", socket=sc) == "disconnected"
    record("R4", f"write after the peer closed: status {done['status']} (RETRY_EXC_ERR); pending recv when the "
                 "peer was killed and the loss relayed: CONNECTION_RESET")


@rdma
def test_window_bind_and_invalidate_behind_a_waiting_send(lab: Lab, spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    needs_rnr(a)
    if lab.wait_bounded:
        pytest.skip("this kernel's rxe ends a waiting send after about 2 s: nothing stays queued behind one")
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    send = a.call("send", socket=sa, buffers=[[src, 64, h]])  # waits: b has posted no receive
    t0 = time.monotonic()
    target, desc = window(a, sa, 4096, Access.WRITE)  # bind posted behind the waiting send
    took = time.monotonic() - t0
    bsrc, hb = source(b, sb, DATA)
    done = write(b, sb, bsrc, hb, desc, length=4096)
    assert done["status"] == 0 and target.read() == DATA[:4096]
    a.call("deregister_rdma_memory", socket=sa, descriptor=desc)  # invalidate, also behind the send
    again = write(b, sb, bsrc, hb, desc, length=16)
    assert again["status"] == Status.ACCESS_VIOLATION.value
    pending = not a.call("op_done", op_id=send)
    # A window made and released behind a send the peer lets wait (RNR retries meanwhile): the send still
    # completes once the receive comes, and the connection goes on (rxe-local-op-replayed: rxe 6.12 replays
    # a bind or invalidate posted behind a retried request and breaks the QP; on 6.1 the send hangs).
    sa2, sb2 = connect(a, b)
    src2, h2 = source(a, sa2, DATA)
    send2 = a.call("send", socket=sa2, buffers=[[src2, 64, h2]])
    _, desc2 = window(a, sa2, 4096, Access.WRITE)
    a.call("deregister_rdma_memory", socket=sa2, descriptor=desc2)
    time.sleep(2.0)  # retries of the waiting send, whatever their pace; the outcome must not depend on it
    sink = Guarded(b, 64)
    hs = b.call("register_memory", socket=sb2, address=sink.address, length=64, access=Access.WRITE)
    b.call("recv", socket=sb2, buffers=[[sink.address, 64, hs]])
    assert wait(a, send2) == {"status": Status.SUCCESS.value, "bytes": 64}
    assert sink.read() == DATA[:64] and sink.intact()
    b.call("recv", socket=sb2, buffers=[[sink.address, 64, hs]])
    assert wait(a, a.call("send", socket=sa2, buffers=[[src2, 64, h2]])) == {"status": Status.SUCCESS.value,
                                                                            "bytes": 64}
    record("BIND", f"bind behind a waiting send took {took:.2f}s, window usable; invalidate behind it: peer write "
                   f"then {again['status']}; send still pending: {pending}; a window made and released behind a "
                   f"retried send: the send and the next completed SUCCESS (workarounds: {sorted(lab.workarounds)})")


@rdma
def test_burst_behind_a_waiting_send_is_in_use_then_completes_or_aborts(
        spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn()
    needs_rnr(a)
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, len(DATA), Access.WRITE)
    burst_args = {"socket": sa, "buffers": [[src, len(DATA), h]], "descriptor": desc, "offset": 0}
    for bad in ({"count": 0, "depth": 4}, {"count": 4, "depth": 0}):
        assert san_error(lambda: a.call("rdma_write_burst", **burst_args, **bad)).code == WsaError.WSAEINVAL  # noqa: B023
    a.call("send", socket=sa, buffers=[[src, 64, h]])  # waits: b has posted no receive, so the burst queues
    burst = a.call("rdma_write_burst", **burst_args, count=40, depth=32)
    time.sleep(0.5)
    assert not a.call("op_done", op_id=burst)
    assert san_error(lambda: a.call("deregister_memory", socket=sa, handle=h)).code == WsaError.WSAEINVAL  # R13
    # The send queue counts the burst's 32 work requests: room for QUEUE_DEPTH - 1 - 32 more operations.
    room = 0
    while room <= QUEUE_DEPTH:
        try:
            a.call("rdma_write", **burst_args)
        except SanError as exc:
            assert exc.code == WsaError.WSAENETDOWN
            break
        room += 1
    assert room == QUEUE_DEPTH - 1 - 32
    rbuf, _ = b.alloc(4096)
    hr = b.call("register_memory", socket=sb, address=rbuf, length=4096, access=Access.WRITE)
    b.call("recv", socket=sb, buffers=[[rbuf, 4096, hr]])  # the send goes, then everything behind it
    assert wait(a, burst) == {"status": Status.SUCCESS.value, "bytes": 40 * len(DATA)}
    assert target.read() == DATA and target.intact()
    a.call("deregister_memory", socket=sa, handle=h)  # complete: no longer in use
    # Closed under a pending burst: ABORTED, nothing of it moved, every registration released (R11).
    src2, h2 = source(a, sa, DATA)
    a.call("send", socket=sa, buffers=[[src2, 64, h2]])
    burst2 = a.call("rdma_write_burst", socket=sa, buffers=[[src2, len(DATA), h2]], descriptor=desc, offset=0,
                    count=40, depth=4)
    a.call("close_socket", socket=sa)
    assert wait(a, burst2) == {"status": Status.ABORTED.value, "bytes": 0}
    assert a.call("leaks") == []
    record("BURST", f"burst behind a waiting send: pending, its handle WSAEINVAL, {room} more operations fit; "
                    "after the peer's receive: SUCCESS 40 x 4 KiB; closed under one: ABORTED 0 bytes, no leak")


@rdma
def test_kill_releases_the_process_registrations(spawn: Callable[..., host.ChildProcess], lab: Lab) -> None:
    a, b = spawn(), spawn()
    sa, _sb = connect(a, b)
    for _ in range(3):
        window(a, sa, 4096, Access.READWRITE)
    a.kill()
    assert not a.alive and a.returncode is not None
    c = spawn()  # the device is still fine for the next process
    sc, _sb2 = connect(c, b)
    _, desc = window(c, sc, 4096, Access.WRITE)
    assert len(desc) == DESCRIPTOR_SIZE


@rdma
def test_mr_fallback_mode_is_honest(spawn: Callable[..., host.ChildProcess]) -> None:
    a, b = spawn(), spawn(mw_mode="mr")
    assert b.hello["mw_mode"] == "mr"
    assert "memory_windows" not in host.host_capabilities(host.PinnedProxy(), b.hello)
    sa, sb = connect(a, b)
    src, h = source(a, sa, DATA)
    target, desc = window(b, sb, len(DATA), Access.READ)
    done = write(a, sa, src, h, desc)
    assert done["status"] == Status.ACCESS_VIOLATION.value and target.unchanged()  # R6 still kept by the MR's flags


# -- host side, protocol and packaging: everywhere -------------------------------------------------------


def test_no_device_is_reported_cleanly(tmp_path: Path) -> None:
    missing = str(tmp_path / "infiniband")
    with pytest.raises(host.NoRdmaDevice, match=r"no RDMA device: .* is absent"):
        host.select_device(sysfs=missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(host.NoRdmaDevice, match="is empty"):
        host.select_device(sysfs=str(empty))


@pytest.mark.skipif(RDMA_SKIP is None, reason="this host has an RDMA device: the no-device path is not reachable")
def test_child_without_a_device_says_so() -> None:
    python = host.pyverbs_python() or sys.executable
    with pytest.raises(host.NoRdmaDevice) as err:
        host.ChildProcess("rxe0", python=python)
    assert "no RDMA device" in str(err.value) or "pyverbs not importable" in str(err.value)


def test_device_and_gid_selection_from_sysfs(tmp_path: Path) -> None:
    def port(dev: str, n: int, state: str, gids: dict[int, tuple[str, str]]) -> None:
        base = tmp_path / dev / "ports" / str(n)
        (base / "gids").mkdir(parents=True)
        (base / "gid_attrs" / "types").mkdir(parents=True)
        (base / "state").write_text(state + "\n")
        for i, (gid, kind) in gids.items():
            (base / "gids" / str(i)).write_text(gid + "\n")
            (base / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")

    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    port("mlx0", 1, "1: DOWN", {})
    port("rxe0", 1, "4: ACTIVE", {0: ("fe80:0000:0000:0000:acad:d2ff:fe03:2dd0", "RoCE v2"),
                                  1: ("0000:0000:0000:0000:0000:ffff:0a37:0001", "RoCE v2"), 2: (zero, "")})
    sysfs = str(tmp_path)
    assert host.select_device(sysfs=sysfs) == ("rxe0", 1)
    assert host.select_device("rxe0", sysfs=sysfs) == ("rxe0", 1)
    with pytest.raises(host.NoRdmaDevice, match="ACTIVE"):
        host.select_device("mlx0", sysfs=sysfs)
    with pytest.raises(host.NoRdmaDevice, match="not found"):
        host.select_device("nope", sysfs=sysfs)
    port("rxe0", 2, "1: DOWN", {})
    port("rxe1", 2, "4: ACTIVE", {})
    assert host.select_device(sysfs=sysfs, port=2) == ("rxe1", 2)  # san_port: the first device with it ACTIVE
    assert host.select_device("rxe0", sysfs=sysfs, port=1) == ("rxe0", 1)
    with pytest.raises(host.NoRdmaDevice, match="port 2 ACTIVE"):
        host.select_device("rxe0", sysfs=sysfs, port=2)
    assert host.select_gid_index("rxe0", 1, sysfs=sysfs) == 1  # the IPv4-mapped RoCE v2 GID
    assert host.select_gid_index("rxe0", 1, 0, sysfs=sysfs) == 0
    with pytest.raises(host.NoRdmaDevice):
        host.select_gid_index("rxe0", 1, 2, sysfs=sysfs)  # a zero (unset) entry


def test_proxy_pins_and_frees_memory() -> None:
    proxy = host.PinnedProxy("lab")
    assert proxy.device_flags & DO_DIRECT_IO and proxy.nolowmem is False
    with pytest.raises(SanError) as err:
        proxy.set_nolowmem(True)
    assert err.value.code == WsaError.WSAEOPNOTSUPP
    allocs = [proxy.allocate(n) for n in (1, 4096, 10000)]
    assert proxy.live_allocations() == 3
    caps = proxy.capabilities()
    for a in allocs:
        if "physical_addresses" in caps:
            assert sum(n for _, n in a.physical_runs) == a.length
            assert all(addr > 0 for addr, _ in a.physical_runs)
        else:
            assert a.physical_runs == ()
    proxy.free(allocs[0])
    with pytest.raises(SanError) as err:
        proxy.free(allocs[0])
    assert err.value.code == WsaError.WSAEINVAL
    with pytest.raises(SanError):
        proxy.allocate(0)
    for a in allocs[1:]:
        proxy.free(a)
    assert proxy.live_allocations() == 0 and proxy.leaks() == []
    assert "nolowmem" not in caps and "faults" not in caps


def test_proxy_refuses_what_is_not_an_integer() -> None:
    """True and 1.0 compare equal to 1; a proxy that took them would pin memory for a typo (CONTRACT.md section 4)."""
    proxy = host.PinnedProxy("lab")
    for bad in (True, 1.0, "4096", None, -1):
        assert san_error(lambda: proxy.allocate(bad)).code == WsaError.WSAEINVAL  # noqa: B023
    for args in (("8192", 0, 1 << 40, 0, 1), (8192, 0, 1 << 40, 0, "x"), (8192, 0, 1 << 40, 0, 1.0),
                 (8192, None, 1 << 40, 0, 1)):
        assert san_error(lambda: proxy.allocate_contiguous(*args)).code == WsaError.WSAEINVAL  # noqa: B023
    assert san_error(lambda: proxy.free_contiguous("x", 8192, 1)).code == WsaError.WSAEINVAL
    zeroed = {"version": 0, "master": True, "scatter_gather": False, "dma32": False, "dma64": True,
              "maximum_length": 1 << 20, "interface_type": 0}
    for field, bad in (("maximum_length", "1"), ("version", 1.0), ("master", 1), ("dma64", "yes")):
        assert san_error(lambda: proxy.get_dma_adapter(dict(zeroed, **{field: bad}))).code \
            == WsaError.WSAEINVAL  # noqa: B023
    adapter = proxy.get_dma_adapter(zeroed)
    assert san_error(lambda: adapter.allocate_common_buffer("4096", True)).code == WsaError.WSAEINVAL
    assert san_error(lambda: adapter.allocate_common_buffer(4096, "yes")).code == WsaError.WSAEINVAL
    assert san_error(lambda: adapter.free_common_buffer(4096, None, 0, True)).code == WsaError.WSAEINVAL
    proxy.put_dma_adapter(adapter)
    assert proxy.live_allocations() == 0 and proxy.leaks() == []


def test_engine_checks_scatter_lists_before_the_child_sees_them() -> None:
    """The agent runs the objects stage of pytest_san.spi.checks itself: a malformed entry after a good one is a
    TypeError naming it, and too many entries WSAEINVAL whatever they hold, before any request reaches the child
    (which would mark the good pair's handle in use); a good list reaches it as [address, length, handle]."""
    from hil.agent.engines.verbs.engine import ModelledProcess, VerbsBuffer, VerbsProvider, VerbsSocket

    class Child:
        alive = True

        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, Any]]] = []

        def call(self, method: str, **params: Any) -> int:
            self.calls.append((method, params))
            return 1

    def process() -> ModelledProcess:
        made = ModelledProcess.__new__(ModelledProcess)  # no child process: a recording stand-in
        made.child, made.pid = Child(), 4242  # type: ignore[assignment]
        return made

    mine, theirs = process(), process()
    sock = VerbsSocket(mine, 1)
    provider = VerbsProvider.__new__(VerbsProvider)
    good = (VerbsBuffer(mine, 0x1000, 16), 7)
    other = VerbsBuffer(theirs, 0x2000, 16)  # another process's buffer: WSAEFAULT...
    for bad in ([good, None], [good, (good[0],)], [good, (None, 7)], "x", [good, {"buffer": 1}],
                [good, (other, 7), [good[0]]]):  # ... but a malformed entry after it is the TypeError, as in-process
        with pytest.raises(TypeError, match="local_buffers"):
            provider.rdma_write(sock, bad, b"d" * DESCRIPTOR_SIZE)
    for many in ([good] * MAX_SGE + [(other, 7)], [(other, 7)] * (MAX_SGE + 1), [good] * MAX_SGE + [None]):
        with pytest.raises(SanError) as refused:
            provider.send(sock, many)
        assert refused.value.code is WsaError.WSAEINVAL
    with pytest.raises(SanError) as refused:
        provider.rdma_read(sock, [good, (other, 7)], b"d" * DESCRIPTOR_SIZE)
    assert refused.value.code is WsaError.WSAEFAULT
    assert mine.child.calls == []  # type: ignore[attr-defined]
    provider.rdma_write(sock, [good], b"d" * DESCRIPTOR_SIZE, 0)
    assert mine.child.calls == [("rdma_write", {"socket": 1, "buffers": [[0x1000, 16, 7]],  # type: ignore[attr-defined]
                                                "descriptor": b"d" * DESCRIPTOR_SIZE, "offset": 0})]


def test_proxy_contiguous_memory_or_none() -> None:
    proxy = host.PinnedProxy("lab")
    caps = proxy.capabilities()
    base = proxy.allocate_contiguous(8192, 0, (1 << 64) - 1, 0, CacheType.CACHED)
    record("PROXY", f"capabilities {sorted(caps)}; allocate_contiguous(8192) -> "
                    f"{'None' if base is None else hex(base)}")
    if "contiguous" not in caps:
        assert base is None  # declared missing, and honestly so
        return
    assert base is not None and base % PAGE_SIZE == 0
    with pytest.raises(SanError):
        proxy.free_contiguous(base, 8192, CacheType.NON_CACHED)  # the cache type must match
    proxy.free_contiguous(base, 8192, CacheType.CACHED)
    assert proxy.allocate_contiguous(4096, 0, 4095, 0, CacheType.CACHED) is None  # no page at physical 0
    assert proxy.live_allocations() == 0


def test_proxy_dma_adapter_needs_a_zeroed_description() -> None:
    proxy = host.PinnedProxy("lab")
    with pytest.raises(SanError, match="uninitialised"):
        proxy.get_dma_adapter({"version": 0, "master": True})
    zeroed = {"version": 0, "master": False, "scatter_gather": False, "dma32": False, "dma64": False,
              "maximum_length": 0, "interface_type": 0}
    with pytest.raises(SanError, match="master"):
        proxy.get_dma_adapter(zeroed)
    adapter = proxy.get_dma_adapter(dict(zeroed, master=True, maximum_length=1 << 20, dma64=True))
    assert adapter.dma32 is False
    got = adapter.allocate_common_buffer(4096, True)
    if "contiguous" in proxy.capabilities():
        assert got is not None
        virtual, logical = got
        with pytest.raises(SanError):
            proxy.put_dma_adapter(adapter)  # a common buffer is still out
        with pytest.raises(SanError):
            adapter.free_common_buffer(4096, logical, virtual, False)  # cache_enabled differs
        adapter.free_common_buffer(4096, logical, virtual, True)
    else:
        assert got is None
    proxy.put_dma_adapter(adapter)
    assert proxy.live_allocations() == 0


def test_what_json_cannot_carry_reaches_a_child_as_a_stand_in() -> None:
    from hil.agent.engines.verbs.children import carried
    from hil.rpc.framing import decode, encode

    junk = Opaque("<memory at 0x7f>")
    sent = {"descriptor": junk, "buffers": [[1, 2, 3], (4, 5, object())], "offset": 0, "d": b"\x01"}
    got = decode(encode({"id": 1, "params": carried(sent)}))["params"]
    assert got["descriptor"] == {"$x": "<memory at 0x7f>"} and got["offset"] == 0 and got["d"] == b"\x01"
    assert got["buffers"][0] == [1, 2, 3] and got["buffers"][1][:2] == [4, 5]
    assert set(got["buffers"][1][2]) == {"$x"}


def test_child_protocol_lines() -> None:
    class Fake:
        def alloc(self, nbytes: int) -> dict[str, int]:
            return {"address": 4096, "length": nbytes}

        def read(self, address: int, length: int) -> bytes:
            return b"\x00\xff" * (length // 2)

        def register_rdma_memory(self, **kw: Any) -> bytes:
            raise SanError(WsaError.WSAEFAULT, "too small", required_size=20)

        def op_wait(self, op_id: int, timeout: float) -> dict[str, int]:
            raise TimeoutError("still pending")

    requests = [{"id": 1, "method": "alloc", "params": {"nbytes": 10}},
                {"id": 2, "method": "read", "params": {"address": 1, "length": 4}},
                {"id": 3, "method": "register_rdma_memory", "params": {"socket": 1, "descriptor_size": 4}},
                {"id": 4, "method": "op_wait", "params": {"op_id": 1, "timeout": 0.1}},
                {"id": 5, "method": "nonsense"},
                {"id": 6, "method": "exit"},
                {"id": 7, "method": "alloc", "params": {"nbytes": 1}}]
    inp = io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    out = io.BytesIO()
    serve(Fake(), inp, out)
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["id"] for r in replies] == [1, 2, 3, 4, 5, 6]  # nothing after exit
    assert replies[0]["result"] == {"address": 4096, "length": 10}
    assert replies[1]["result"] == {"$b": "AP8A/w=="}
    assert replies[2]["error"] == {"code": WsaError.WSAEFAULT, "kind": "SanError", "message": "too small",
                                   "required_size": 20}
    assert replies[3]["error"]["kind"] == "TimeoutError" and replies[3]["error"]["code"] is None
    assert replies[4]["error"]["kind"] == "LookupError"
    with pytest.raises(SanError) as err:
        host.raise_error(replies[2]["error"])
    assert err.value.code == WsaError.WSAEFAULT and err.value.required_size == 20
    with pytest.raises(TimeoutError):
        host.raise_error(replies[3]["error"])


def test_agent_code_is_python39_and_standalone() -> None:
    files = sorted(VERBS_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"enums.py", "process.py", "child.py", "host.py"}
    for path in files:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path), feature_version=(3, 9))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module in ("pytest_san", "pytest_san.spi") \
                    and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." if node.level else "") + (node.module or "")]
            else:
                continue
            for name in names:
                if name.startswith("pytest_san"):  # the contract's values, checks and DMA adapters' books: never
                    # the emulator or pytest
                    assert name in ("pytest_san.spi.contract", "pytest_san.spi.checks", "pytest_san.spi.dma"), \
                        f"{path.name} imports {name}: the agent must not"
                    continue
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("pyverbs", "hil", ""), f"{path.name}: {name}"
        if path.name != "enums.py":
            assert "pyverbs.enums" not in source and "libibverbs_enums" not in source, \
                f"{path.name}: import IBV_* names through enums.py"
        assert "slots=True" not in source
        assert source.startswith('"""') and "from __future__ import annotations" in source


@rdma
def test_a_spawned_process_is_the_spare_started_at_the_last_spawn(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """spawn_process takes the child started when the previous process was spawned (a pyverbs child takes
    seconds to start in a TCG guest); a spare that died is replaced by a fresh child; close ends the spare."""
    from hil.agent.engines.verbs.engine import VerbsEngine

    monkeypatch.setattr(sys, "executable", lab.python)  # the agent's python3 is the one with pyverbs
    engine = VerbsEngine("lab", lab.device, netdev=os.environ.get("SAN_NETDEV"), port=lab.port)
    spares = []
    try:
        assert engine._spare is None  # none before the first spawn: the agent's hello comes sooner
        first = engine.spawn()
        spare = engine._spare
        assert spare is not None and spare.alive and first.child is not spare
        process = engine.spawn()
        assert process.child is spare and process.alive and spare.hello["pid"] == spare.pid
        dead = engine._spare
        assert dead is not None and dead is not spare
        dead.kill()
        fresh = engine.spawn()
        assert fresh.child is not dead and fresh.alive
        spares.append(engine._spare)
        assert engine.leaks() == []
    finally:
        engine.close()
    assert spares[0] is not None and not spares[0].alive and engine._spare is None


@rdma
def test_the_engine_judges_odd_arguments_as_the_emulator_does(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the SPI fuzz on siw: a connection from or to a killed process is WSAENOTCONN (the child's
    ChildGone escaped the call), and a duck-typed buffer of another host is WSAEFAULT (it was a TypeError)."""
    from hil.agent.engines.verbs.engine import VerbsEngine

    monkeypatch.setattr(sys, "executable", lab.python)
    engine = VerbsEngine("lab", lab.device, netdev=os.environ.get("SAN_NETDEV"), port=lab.port)
    try:
        live, doomed = engine.default_process, engine.node.spawn_process()
        doomed.kill()
        for a, b in ((doomed, live), (live, doomed)):
            with pytest.raises(SanError) as refused:
                engine.connect_local(a, b)
            assert refused.value.code is WsaError.WSAENOTCONN and "is gone" in str(refused.value)
        assert engine.leaks() == []
        sa, sb = engine.connect_local(live, engine.node.spawn_process())
        assert sa.state() == [True, False] and sb.state() == [True, False]
        # A buffer the controller sent field by field (duck-typed, dispatch.RawBuffer) is judged as in-process:
        # another host's or process's is WSAEFAULT whatever its fields, one's own with junk fields WSAEINVAL.
        from hil.agent.dispatch import ForeignProcess, RawBuffer

        provider = engine.provider
        for buffer, code in ((RawBuffer(ForeignProcess("lab2"), None, "8"), WsaError.WSAEFAULT),
                             (RawBuffer(sb.process, 4096, 8), WsaError.WSAEFAULT),
                             (RawBuffer(live, None, "8"), WsaError.WSAEINVAL)):
            for register in (provider.register_memory, provider.register_rdma_memory):
                with pytest.raises(SanError) as refused:
                    register(sa, buffer, Access.WRITE)
                assert refused.value.code is code, (buffer, refused.value)
        with pytest.raises(TypeError):
            provider.register_memory(sa, object(), Access.WRITE)
        assert provider.registrations(sa) == [] and engine.leaks() == []
    finally:
        engine.close()
