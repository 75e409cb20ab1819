"""Differential fuzz of the hil path: random SPI call sequences, good and bad input mixed, run on the
in-process emulator and on two emulator-engine agents behind the test sshd, must give the same
outcome at every step (CONTRACT.md section 4: the same errors on every backend).

After every call both backends must agree on the registrations (kind, length, access, refs) of both
sockets, the proxies' live allocations and the bytes of the application buffers; at the end every
socket is closed and neither leaks. "Another host" is another agent's node on the hil backend and
another node in-process. SAN_FUZZ_EXAMPLES sets the number of sequences (100, about 15 s; more for a
longer hunt: 3000 passed in 5 minutes).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hil.controller.backend import HilBackend
from hil.controller.client import AgentError
from hil.inventory import HostConfig
from pytest_san import Access, Backend, CacheType, DeviceDescription, SanError
from pytest_san.spi.emulator import EmulatorBackend

EXAMPLES = int(os.environ.get("SAN_FUZZ_EXAMPLES", "100"))


class Other(enum.IntEnum):
    ONE = 1


class Thing:
    def __repr__(self) -> str:
        return "<a thing>"


# --- what a step is: symbols, resolved against each backend's objects ------------------------------

def mostly(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Any]:
    """Each good value about four times as often as each bad one: sequences get past the first refusal."""
    return st.sampled_from(good * 4 + bad)


SOCKETS = mostly(["a", "b"], ["far", "none", "thing"])
BUFFERS = mostly(["a1", "a2", "a1[8:24]", "b1"],
                 ["a1[0:0]", "far", "negative", "unmapped", "none", "thing", "a1 past its end"])
ACCESS = mostly([1, 2, 3, Access.READ, Access.READWRITE], [0, 4, -1, True, 1.0, "1", None, Other.ONE])
HANDLES = st.one_of(st.integers(0, 7), st.integers(0, 7), st.sampled_from(["true", "str", "none", "float",
                                                                               "junk"]))
DESCRIPTORS = st.one_of(st.integers(0, 7), st.integers(0, 7),
                        st.sampled_from(["int20", "memoryview", "short", "long", "str", "bytearray"]))
ENTRY = st.one_of(st.tuples(BUFFERS, HANDLES), st.tuples(BUFFERS, HANDLES),
                  st.sampled_from(["none", "single", "triple", "list-pair"]))
SCATTER = st.one_of(st.lists(ENTRY, min_size=1, max_size=2), st.lists(ENTRY, max_size=5),
                    st.sampled_from(["dict", "str", "none", "generator"]))
OFFSETS = mostly([0, 8, 100], [4090, -1, True, 1.0, None])
TRANSFERS = st.tuples(st.sampled_from(["rdma_write", "rdma_read"]), SOCKETS, SCATTER, DESCRIPTORS, OFFSETS)
MESSAGES = st.tuples(st.sampled_from(["send", "recv"]), SOCKETS, SCATTER)
WAITS = st.tuples(st.just("wait"), st.integers(0, 5), mostly([0.01, 1], [0, "x", True]))

# Calls that should work from the first step on (the handles and windows World.make registers), so
# that transfers complete, are pending, hold registrations in use and move bytes.
GOOD = st.sampled_from([
    ("rdma_write", "a", [("a1", 0)], 0, 0), ("rdma_write", "a", [("a1[8:24]", 0), ("a1", 0)], 0, 100),
    ("rdma_read", "a", [("a1", 0)], 0, 8), ("rdma_write", "b", [("b1", 1)], 1, 0),
    ("send", "a", [("a1[8:24]", 0)]), ("recv", "b", [("b1", 1)]), ("send", "b", [("b1", 1)]),
    ("recv", "a", [("a1", 0)]), ("register", "a", "a2", 3), ("register_rdma", "b", "b1", 2, None),
    ("wait", 0, 1), ("wait", 1, 0.01), ("wait", 2, 1),
])

STEPS = st.one_of(
    GOOD, GOOD, GOOD,
    st.tuples(st.just("register"), SOCKETS, BUFFERS, ACCESS),
    st.tuples(st.just("register_rdma"), SOCKETS, BUFFERS, ACCESS, mostly([None, 20, 64], [3, True, 1.5, "20"])),
    st.tuples(st.just("deregister"), SOCKETS, HANDLES),
    st.tuples(st.just("deregister_rdma"), SOCKETS, DESCRIPTORS),
    MESSAGES, MESSAGES, TRANSFERS, TRANSFERS, WAITS, WAITS,
    st.tuples(st.just("write"), st.sampled_from(["a1", "a2", "b1"]), st.binary(max_size=16),
              mostly([0, 5, 100], [4090, -1, True])),
    st.tuples(st.just("getsockopt"), SOCKETS, mostly([0x700D, 0x700E], [0, "x", True, None])),
    st.tuples(st.just("alloc"), mostly([1, 64, 4096], [0, -1, True, 1.5, "64", Other.ONE])),
    st.tuples(st.just("proxy allocate"), mostly([1, 4096, 10000], [0, -1, True, 1.5, None, Other.ONE])),
    st.tuples(st.just("proxy free"), st.sampled_from([None, "thing", 0, "far"])),
    st.tuples(st.just("contiguous"), mostly([4096, 8192], [0, -1, True, 1.5]),
              mostly([CacheType.CACHED, 0, 2], [True, 1.0, 3, None, Other.ONE])),
    st.tuples(st.just("dma adapter"), st.sampled_from(["zeroed", "dma64", "uninitialised", "dict", "none",
                                                       "version str", "master 1"])),
    st.tuples(st.just("nolowmem"), st.sampled_from([False, 1, 0, None, "yes"])),
)
CLOSE = st.tuples(st.sampled_from(["close", "kill"]), st.sampled_from(["a", "b"]))


@dataclasses.dataclass
class World:
    """One backend's objects for a sequence, and what its calls handed back (by position)."""

    backend: Backend
    socks: dict[str, Any]
    procs: dict[str, Any]
    bufs: dict[str, Any]
    handles: list[Any] = dataclasses.field(default_factory=list)
    descriptors: list[bytes] = dataclasses.field(default_factory=list)
    ops: list[Any] = dataclasses.field(default_factory=list)

    @classmethod
    def make(cls, backend: Backend, nodes: tuple[Any, Any], far: tuple[Any, Any]) -> World:
        pa, pb = nodes[0].default_process, nodes[1].default_process
        fa, fb = far[0].default_process, far[1].default_process
        sa, sb = backend.connect_sockets(pa, pb)
        fsa, _ = backend.connect_sockets(fa, fb)
        bufs = {"a1": pa.alloc(4096), "a2": pa.alloc(64), "b1": pb.alloc(4096), "far": fa.alloc(64)}
        world = cls(backend, {"a": sa, "b": sb, "far": fsa}, {"a": pa, "b": pb}, bufs)
        # Something to use from the first step on: a handle each, a window each.
        world.handles += [sa.process.node.provider.register_memory(sa, bufs["a1"], Access.READWRITE),
                          sb.process.node.provider.register_memory(sb, bufs["b1"], Access.READWRITE)]
        world.descriptors += [sb.process.node.provider.register_rdma_memory(sb, bufs["b1"], Access.READWRITE),
                              sa.process.node.provider.register_rdma_memory(sa, bufs["a2"], Access.WRITE)]
        return world

    def socket(self, name: str) -> Any:
        if name == "none":
            return None
        return Thing() if name == "thing" else self.socks[name]

    def buffer(self, name: str) -> Any:
        a1 = self.bufs["a1"]
        special = {"a1[8:24]": lambda: a1.view(8, 16), "a1[0:0]": lambda: a1.view(0, 0),
                   "negative": lambda: self.procs["a"].buffer_at(a1.address, -8),
                   "unmapped": lambda: self.procs["a"].buffer_at(0x1000, 64),
                   "a1 past its end": lambda: self.procs["a"].buffer_at(a1.address + 4000, 200),
                   "none": lambda: None, "thing": Thing}
        return special[name]() if name in special else self.bufs[name]

    def handle(self, sym: Any) -> Any:
        if isinstance(sym, int):
            return self.handles[sym % len(self.handles)] if self.handles else 0x7FFF
        first = self.handles[0] if self.handles and isinstance(self.handles[0], int) else 1
        return {"true": True, "str": str(first), "none": None, "float": float(first), "junk": 0x1234567}[sym]

    def descriptor(self, sym: Any) -> Any:
        good = self.descriptors[sym % len(self.descriptors)] if isinstance(sym, int) and self.descriptors else None
        if isinstance(sym, int):
            return good if good is not None else bytes(20)
        some = self.descriptors[0] if self.descriptors else bytes(20)
        return {"int20": 20, "memoryview": memoryview(some), "short": some[:-1], "long": some + b"\0",
                "str": "x" * 20, "bytearray": bytearray(some)}[sym]

    def scatter(self, sym: Any) -> Any:
        if isinstance(sym, str):
            return {"dict": {}, "str": "ab", "none": None,
                    "generator": (x for x in [(self.bufs["a1"], self.handle(0))])}[sym]
        out: list[Any] = []
        for entry in sym:
            if isinstance(entry, str):
                one = (self.bufs["a1"], self.handle(0))
                out.append({"none": None, "single": one[:1], "triple": (*one, 0), "list-pair": list(one)}[entry])
            else:
                out.append((self.buffer(entry[0]), self.handle(entry[1])))
        return out

    def step(self, step: tuple[Any, ...]) -> Any:
        kind, args = step[0], step[1:]
        if kind in ("register", "register_rdma"):
            sock, buf, access = self.socket(args[0]), self.buffer(args[1]), args[2]
            if kind == "register":
                self.handles.append(self.provider(args[0]).register_memory(sock, buf, access))
                return "handle"
            self.descriptors.append(self.provider(args[0]).register_rdma_memory(sock, buf, access, args[3]))
            return "descriptor"
        provider: Any = self.provider(args[0]) if kind not in ("wait", "write") else None
        if kind == "deregister":
            return provider.deregister_memory(self.socket(args[0]), self.handle(args[1]))
        if kind == "deregister_rdma":
            return provider.deregister_rdma_memory(self.socket(args[0]), self.descriptor(args[1]))
        if kind in ("send", "recv"):
            self.ops.append(getattr(provider, kind)(self.socket(args[0]), self.scatter(args[1])))
            return "op"
        if kind in ("rdma_write", "rdma_read"):
            self.ops.append(getattr(provider, kind)(self.socket(args[0]), self.scatter(args[1]),
                                                    self.descriptor(args[2]), args[3]))
            return "op"
        if kind == "wait":
            if not self.ops:
                return None
            done = self.ops[args[0] % len(self.ops)].wait(args[1])
            return (done.status, done.bytes)
        if kind == "write":
            return self.bufs[args[0]].write(args[1], args[2])
        if kind == "getsockopt":
            return provider.getsockopt(self.socket(args[0]), args[1])
        if kind == "close":
            return provider.close_socket(self.socks[args[0]])
        if kind == "kill":
            return self.procs[args[0]].kill()
        if kind == "alloc":
            self.procs["a"].alloc(args[0])
            return "buffer"
        proxy = self.procs["a"].node.proxy
        if kind == "proxy allocate":
            return proxy.free(proxy.allocate(args[0]))
        if kind == "proxy free":
            junk = {"thing": Thing(), "far": self.bufs["far"]}.get(args[0], args[0])
            return proxy.free(junk)
        if kind == "contiguous":
            base = proxy.allocate_contiguous(args[0], 0, 1 << 40, 0, args[1])
            return base if base is None else proxy.free_contiguous(base, args[0], args[1])
        if kind == "dma adapter":
            zeroed = DeviceDescription.zeroed()
            description = {"zeroed": zeroed, "dma64": dataclasses.replace(zeroed, dma64=True, master=True),
                           "uninitialised": DeviceDescription(), "dict": dataclasses.asdict(zeroed), "none": None,
                           "version str": dataclasses.replace(zeroed, version="1"),  # type: ignore[arg-type]
                           "master 1": dataclasses.replace(zeroed, master=1)}[args[0]]  # type: ignore[arg-type]
            adapter = proxy.get_dma_adapter(description)
            return proxy.put_dma_adapter(adapter)
        assert kind == "nolowmem"
        proxy.set_nolowmem(args[0])
        proxy.set_nolowmem(False)
        return None

    def provider(self, sock: str) -> Any:
        return self.socks["b" if sock == "b" else "a"].process.node.provider

    def state(self) -> list[Any]:
        regs = [sorted((r.kind, r.length, int(r.access), r.refs) for r in attempt(
            lambda s=s: self.provider(s).registrations(self.socks[s]), [])) for s in ("a", "b")]
        live = [self.procs[p].node.proxy.live_allocations() for p in ("a", "b")]
        data = [hashlib.sha256(attempt(self.bufs[b].read, b"?")).hexdigest()[:12] for b in ("a1", "a2", "b1")]
        return [regs, live, data]

    def finish(self) -> list[Any]:
        for name in ("a", "b", "far"):
            sock = self.socks[name]
            attempt(lambda sock=sock: sock.process.node.provider.close_socket(sock), None)
        return list(self.backend.leaks())


def attempt(call: Any, default: Any) -> Any:
    try:
        return call()
    except SanError:
        return default


def outcome(world: World, step: tuple[Any, ...]) -> Any:
    try:
        return ("ok", world.step(step))
    except AgentError as exc:  # never for bad input: that is the engine's error, not the agent failing
        pytest.fail(f"{step}: AgentError {exc}")
    except SanError as exc:
        return ("SanError", exc.code)
    except TypeError as exc:
        return ("TypeError", str(exc).split()[0])  # the argument it names
    except (ValueError, TimeoutError) as exc:
        return (type(exc).__name__,)


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorBackend]:
    backend = EmulatorBackend(4)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def hil(sshd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HilBackend]:
    from tests.support.lab_hosts import host_configs

    hosts: list[HostConfig] = host_configs(sshd, tmp_path_factory.mktemp("fuzz-remote-tmp"))
    backend = HilBackend(hosts)
    yield backend
    backend.close()


def test_random_call_sequences_behave_the_same_over_ssh(emulator: EmulatorBackend, hil: HilBackend) -> None:
    assert len(hil.agents) == 2
    emulated = (emulator.nodes[0], emulator.nodes[1]), (emulator.nodes[2], emulator.nodes[3])
    near, far = hil.agents[0].nodes, hil.agents[1].nodes
    remote = (near[0], near[1]), (far[0], far[1])

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.lists(STEPS, min_size=1, max_size=25), st.lists(st.tuples(st.integers(0, 4), CLOSE), max_size=1))
    def sequence(steps: list[tuple[Any, ...]], closes: list[tuple[int, tuple[str, str]]]) -> None:
        for back, close in closes:  # a close ends most of what could follow: at most one, late
            steps.insert(max(0, len(steps) - back), close)
        emulator.reset()
        hil.reset()
        here, there = World.make(emulator, *emulated), World.make(hil, *remote)
        for i, step in enumerate(steps):
            expected, got = outcome(here, step), outcome(there, step)
            event(f"{step[0]}: {expected}")
            assert got == expected, f"step {i} {step}: emulator {expected}, hil {got}"
            assert there.state() == here.state(), f"step {i} {step}: the state differs"
        assert here.finish() == [] and there.finish() == []

    sequence()
