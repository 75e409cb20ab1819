"""Bad input on the hil path gets the error the emulator gives in-process (CONTRACT.md section 4).

Each case runs on the emulator in this process and on two emulator-engine agents behind the test
sshd; the outcomes (exception type, SanError code, the argument a TypeError names, or the completion
status of the operation a call returned) must be the same, and a refused call must change nothing.
"Another host" is another agent's node on the hil backend and another node in-process.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from hil.controller.backend import HilBackend
from hil.controller.client import AgentError
from hil.inventory import HostConfig
from pytest_san import Access, Backend, Connection, DeviceDescription, SanError, Switch
from pytest_san.spi.emulator import EmulatorBackend


class Other(enum.IntEnum):
    ONE = 1  # equal to Access.READ, but no access flag


class Opaque:
    def __repr__(self) -> str:
        return "<an object of the test>"


@dataclass
class Ctx:
    conn: Connection
    buf: Any
    handle: int
    desc: bytes  # the peer's window, writable
    far_buf: Any  # memory of a process on another host (another node in-process)
    far_sock: Any  # a socket on another host

    @property
    def p(self) -> Any:
        return self.conn.local.provider

    @property
    def s(self) -> Any:
        return self.conn.local.socket

    @property
    def proc(self) -> Any:
        return self.conn.local.process

    @property
    def proxy(self) -> Any:
        return self.conn.local.process.node.proxy


def _duck(process: Any, address: Any, length: Any) -> Any:
    return types.SimpleNamespace(process=process, address=address, length=length)


Case = Callable[[Ctx], Any]
CASES: dict[str, Case] = {
    # access: exactly 1, 2, 3 as int or Access
    "access True": lambda c: c.p.register_memory(c.s, c.buf, True),
    "access 1.0": lambda c: c.p.register_memory(c.s, c.buf, 1.0),
    "access '1'": lambda c: c.p.register_memory(c.s, c.buf, "1"),
    "access other IntEnum": lambda c: c.p.register_memory(c.s, c.buf, Other.ONE),
    "access None": lambda c: c.p.register_memory(c.s, c.buf, None),
    "access object": lambda c: c.p.register_memory(c.s, c.buf, Opaque()),
    "access 4": lambda c: c.p.register_rdma_memory(c.s, c.buf, 4),
    "access Access": lambda c: c.p.register_memory(c.s, c.buf, Access.READ | Access.WRITE),
    # buffers: not one, negative, unmapped, another host's
    "buffer None": lambda c: c.p.register_memory(c.s, None, Access.READ),
    "buffer object": lambda c: c.p.register_memory(c.s, Opaque(), Access.READ),
    "buffer negative length": lambda c: c.p.register_memory(c.s, c.proc.buffer_at(c.buf.address, -5), 1),
    "buffer unmapped": lambda c: c.p.register_memory(c.s, c.proc.buffer_at(0x1000, 16), 1),
    "buffer empty": lambda c: c.p.register_rdma_memory(c.s, c.buf.view(0, 0), 1),
    "buffer of another host": lambda c: c.p.register_memory(c.s, c.far_buf, Access.READ),
    # duck-typed buffers (found by the SPI fuzz over SSH): judged field by field, whose process first
    "duck buffer, float address": lambda c: c.p.register_memory(c.s, _duck(c.proc, 1.5, None), Access.READ),
    "duck buffer of another host, float address": lambda c: c.p.register_memory(
        c.s, _duck(c.far_buf.process, float(c.far_buf.address), None), Access.READ),
    "duck buffer, good fields": lambda c: c.p.register_memory(c.s, _duck(c.proc, c.buf.address, 64), 1),
    "another host's buffer, bad access": lambda c: c.p.register_memory(c.s, c.far_buf, 9),
    "socket None": lambda c: c.p.register_memory(None, c.buf, 1),
    "socket of another host": lambda c: c.p.register_memory(c.far_sock, c.buf, 1),
    "socket of another host, bad buffer": lambda c: c.p.register_memory(c.far_sock, None, 1),
    "descriptor_size True": lambda c: c.p.register_rdma_memory(c.s, c.buf, 1, True),
    "descriptor_size 1.5": lambda c: c.p.register_rdma_memory(c.s, c.buf, 1, 1.5),
    "descriptor_size too small": lambda c: c.p.register_rdma_memory(c.s, c.buf, 1, 3),
    # deregistration
    "handle '1'": lambda c: c.p.deregister_memory(c.s, str(c.handle)),
    "handle as float": lambda c: c.p.deregister_memory(c.s, float(c.handle)),
    "handle None": lambda c: c.p.deregister_memory(c.s, None),
    "descriptor int 20": lambda c: c.p.deregister_rdma_memory(c.s, 20),
    "descriptor memoryview": lambda c: c.p.deregister_rdma_memory(c.s, memoryview(c.desc)),
    "descriptor str": lambda c: c.p.deregister_rdma_memory(c.s, "x" * 20),
    # scatter lists
    "pair as list": lambda c: c.p.send(c.s, [[c.buf, c.handle]]),
    "pair of one": lambda c: c.p.send(c.s, [(c.buf,)]),
    "pair of three": lambda c: c.p.send(c.s, [(c.buf, c.handle, 0)]),
    "entry None": lambda c: c.p.send(c.s, [None]),
    "buffers dict": lambda c: c.p.send(c.s, {}),
    "buffers generator": lambda c: c.p.send(c.s, (x for x in [(c.buf, c.handle)])),
    "buffers str": lambda c: c.p.send(c.s, "ab"),
    "buffers None": lambda c: c.p.recv(c.s, None),
    "second entry bad": lambda c: c.p.send(c.s, [(c.buf, c.handle), (None, c.handle)]),
    "pair's buffer None": lambda c: c.p.recv(c.s, [(None, c.handle)]),
    "pair's buffer negative": lambda c: c.p.send(c.s, [(c.proc.buffer_at(c.buf.address, -1), c.handle)]),
    "pair's buffer of another host": lambda c: c.p.send(c.s, [(c.far_buf, c.handle)]),
    "pair's handle True": lambda c: c.p.send(c.s, [(c.buf, True)]),
    "zero-length entry": lambda c: c.p.send(c.s, [(c.buf.view(0, 0), c.handle), (c.buf, c.handle)]),
    # RDMA arguments
    "target descriptor int 20": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], 20, 0),
    "target descriptor str": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], "x" * 20, 0),
    "target descriptor bytearray": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], bytearray(c.desc), 0),
    "target descriptor memoryview": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], memoryview(c.desc), 0),
    "offset True": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], c.desc, True),
    "offset 1.0": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], c.desc, 1.0),
    "offset None": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], c.desc, None),
    "offset negative": lambda c: c.p.rdma_write(c.s, [(c.buf, c.handle)], c.desc, -1),
    "getsockopt str": lambda c: c.p.getsockopt(c.s, "x"),
    "getsockopt None socket": lambda c: c.p.getsockopt(None, 0x700D),
    # processes, buffers, proxies
    "alloc True": lambda c: c.proc.alloc(True),
    "alloc 1.5": lambda c: c.proc.alloc(1.5),
    "alloc -1": lambda c: c.proc.alloc(-1),
    "buffer_at str": lambda c: c.proc.buffer_at("x", 5),
    "read n str": lambda c: c.buf.read("x"),
    "read past the end": lambda c: c.buf.read(8192),
    "write str": lambda c: c.buf.write("abc"),
    "view negative": lambda c: c.buf.view(0, -1),
    "proxy allocate True": lambda c: c.proxy.allocate(True),
    "proxy allocate -1": lambda c: c.proxy.allocate(-1),
    "proxy free object": lambda c: c.proxy.free(Opaque()),
    "nolowmem 1": lambda c: setattr(c.proxy, "nolowmem", 1),
    "dma description dict": lambda c: c.proxy.get_dma_adapter({"version": 1}),
    "dma description uninitialised": lambda c: c.proxy.get_dma_adapter(DeviceDescription()),
    "dma description bad field": lambda c: c.proxy.get_dma_adapter(DeviceDescription(version="3")),  # type: ignore[arg-type]
    "contiguous cache True": lambda c: c.proxy.allocate_contiguous(4096, 0, 1 << 40, 0, True),
    "contiguous cache other IntEnum": lambda c: c.proxy.free_contiguous(  # the proxy takes any integer
        c.proxy.allocate_contiguous(4096, 0, 1 << 40, 0, Other.ONE), 4096, Other.ONE),
    "wait 'x'": lambda c: c.p.recv(c.s, [(c.buf, c.handle)]).wait("x"),
}


def outcome(result: Any) -> tuple[Any, ...]:
    if hasattr(result, "wait"):  # an operation: how it completes
        return ("op", result.wait(10).status)
    return ("returned", type(result).__name__)


def raised(exc: BaseException) -> tuple[Any, ...]:
    assert not isinstance(exc, AgentError), f"an AgentError for bad input: {exc}"
    if isinstance(exc, SanError):
        return ("SanError", exc.code)
    named = str(exc).split()[0] if isinstance(exc, TypeError) else ""  # the argument a TypeError names
    return (type(exc).__name__, named)


def state(c: Ctx) -> list[Any]:
    """What a refused call must not change: registrations and pinned pages of both ends."""
    ends = (c.conn.local, c.conn.remote)
    return [[(r.kind, r.address, r.length, int(r.access), r.refs) for r in e.provider.registrations(e.socket)]
            for e in ends] + [e.process.node.proxy.live_allocations() for e in ends]


def run(backend: Backend, far_node: Any, name: str) -> tuple[Any, ...]:
    conn = Switch(backend).connect()
    a, b = conn.local, conn.remote
    buf = a.process.alloc(4096)
    handle = a.provider.register_memory(a.socket, buf, Access.READWRITE)
    window = b.process.alloc(4096)
    desc = b.provider.register_rdma_memory(b.socket, window, Access.WRITE)
    far = Switch(backend).connect(far_node, far_node)
    c = Ctx(conn, buf, handle, desc, far.local.process.alloc(64), far.local.socket)
    before = state(c)
    try:
        result = outcome(CASES[name](c))
    except Exception as exc:  # what it raised is the outcome
        result = raised(exc)
        assert state(c) == before, f"{name}: a refused call changed something"
    b.provider.deregister_rdma_memory(b.socket, desc)
    conn.close()
    far.close()
    assert backend.leaks() == [], name
    return result


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorBackend]:
    backend = EmulatorBackend(4)
    yield backend
    backend.close()


@pytest.fixture
def hil(hosts: list[HostConfig]) -> Iterator[HilBackend]:
    backend = HilBackend(hosts)
    yield backend
    backend.close()


def test_bad_input_gets_the_emulators_errors_over_ssh(emulator: EmulatorBackend, hil: HilBackend) -> None:
    assert len(hil.agents) == 2
    far_hil = hil.agents[1].nodes[0]  # the switch connects on the first host's nodes
    differences = []
    for name in CASES:
        expected = run(emulator, emulator.nodes[3], name)
        emulator.reset()
        got = run(hil, far_hil, name)
        hil.reset()
        if got != expected:
            differences.append(f"{name}: emulator {expected}, hil {got}")
    assert not differences, "\n".join(differences)


def fault_outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        call()
    except Exception as exc:  # what it raised is the outcome
        return raised(exc)
    return ("returned",)


def fault_outcomes(backend: Backend) -> list[tuple[Any, ...]]:
    faults: Any = backend.faults  # called with what it does not take
    assert faults is not None
    node = backend.nodes[0]
    return [fault_outcome(lambda: faults.drop_link(node, "node1")),
            fault_outcome(lambda: faults.restore_link(None, node)),
            fault_outcome(lambda: faults.fail_allocations(Opaque(), 1)),
            fault_outcome(lambda: faults.hold(node)),
            fault_outcome(lambda: faults.release(None))]


def test_fault_injection_checks_its_arguments_as_the_emulator_does(emulator: EmulatorBackend,
                                                                   hil: HilBackend) -> None:
    expected = [("ValueError", ""), ("ValueError", ""), ("ValueError", ""), ("TypeError", "hold"),
                ("TypeError", "release")]
    assert fault_outcomes(emulator) == expected
    assert fault_outcomes(hil) == expected


def test_a_link_between_two_emulator_hosts_carries_nothing_to_drop(hil: HilBackend) -> None:
    """Each emulator agent is a SAN of its own (no connection joins two hosts): dropping or restoring
    the link between them changes nothing, as the fuzz of tests/support/fuzz_spi.py expects of any node pair."""
    near, far = hil.agents[0].nodes[0], hil.agents[1].nodes[0]
    faults = hil.faults
    assert faults is not None
    conn = Switch(hil).connect()
    faults.drop_link(near, far)
    conn.local.send(b"still up")
    assert conn.remote.recv(8) == b"still up"
    faults.restore_link(far, near)
    faults.drop_link(conn.local.process.node, conn.remote.process.node)  # within a host: it resets
    with pytest.raises(SanError):
        conn.local.send(b"down")
        conn.remote.recv(4, timeout=1)
    faults.restore_link(conn.local.process.node, conn.remote.process.node)
    conn.close()
