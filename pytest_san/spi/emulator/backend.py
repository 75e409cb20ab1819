"""The emulator backend: an in-process SAN of several nodes, the default for every test run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..contract import Leak, SanError, WsaError
from ..protocols import ModelBudget
from .fabric import Fabric
from .node import EmulatedNode
from .process import EmulatedProcess
from .provider import EmulatedProvider
from .proxy import EmulatedProxy
from .sockets import EmulatedSocket

Wrap = Callable[[Any, Any], Any]
MAX_NODES = 255  # node i's handles and window rkeys start at (i + 1) << 24: all fit a descriptor's 32 bits

CAPABILITIES = frozenset({
    "emulator", "rdma_read", "memory_windows", "physical_addresses", "nolowmem", "contiguous",
    "dma_adapter", "faults", "process_kill", "send_waits", "rdma_read_scatter", "direct_io", "cache_types",
    "pinned_bytes",
    "reference_order",  # its provider's checks are pytest_san.spi.checks', in their order (dropped for a plugin's)
})


class EmulatorBackend:
    """``node_count`` nodes on one fabric; ``wrap_*`` let a project plug in its own provider or proxy."""

    name = "emulator"

    def __init__(self, node_count: int = 3, *, wrap_provider: Wrap | None = None,
                 wrap_proxy: Wrap | None = None) -> None:
        if not isinstance(node_count, int) or isinstance(node_count, bool):
            raise TypeError(f"node_count is an integer, got {node_count!r:.80}")
        if not 1 <= node_count <= MAX_NODES:
            raise ValueError(f"an emulated SAN has 1..{MAX_NODES} nodes, got {node_count}")
        self.fabric = Fabric()
        self._nodes: list[EmulatedNode] = []
        for i in range(node_count):
            node = EmulatedNode(f"node{i}")
            base_proxy = EmulatedProxy(node.name)
            node.proxy = wrap_proxy(node, base_proxy) if wrap_proxy else base_proxy
            node.base_proxy = base_proxy
            node.base_provider = EmulatedProvider(node.name, node.proxy, self.fabric,
                                                  handle_base=(i + 1) << 24)
            node.provider = (wrap_provider(node, node.base_provider) if wrap_provider
                             else node.base_provider)
            self._nodes.append(node)
        self._faults = EmulatorFaults(self)
        caps = set(CAPABILITIES)
        if node_count >= 3:
            caps.add("third_host")
        self._capabilities = frozenset(caps)

    @property
    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    def model_budget(self) -> ModelBudget:
        """The suite's reference model here (pytest_san.spi.protocols.DeclaresModelBudget): the defaults, about 1 s;
        the deadline only bounds a provider the model finds wrong, whose every divergence is shrunk by replaying
        its steps many times."""
        return ModelBudget(deadline=10.0)

    @property
    def nodes(self) -> Sequence[EmulatedNode]:
        return self._nodes

    @property
    def faults(self) -> EmulatorFaults:
        return self._faults

    def connect_sockets(self, a: Any, b: Any) -> tuple[EmulatedSocket, EmulatedSocket]:
        """Both processes checked first: a refused connect opens no socket."""
        if not isinstance(a, EmulatedProcess) or not isinstance(b, EmulatedProcess):
            raise TypeError(f"connect_sockets takes processes of this emulator, got {a!r:.80} and {b!r:.80}")
        for process in (a, b):
            self._own_node(process.node, "connect_sockets")
            if not process.alive:
                raise SanError(WsaError.WSAENOTCONN, f"cannot connect: {process!r} is gone")
        pa, pb = a.node.base_provider, b.node.base_provider
        if not self.fabric.link_up(pa, pb):
            raise SanError(WsaError.WSAENETDOWN, f"no link between {a.node.name} and {b.node.name}")
        sa, sb = pa.new_socket(a), pb.new_socket(b)
        self.fabric.connect(sa, sb)
        return sa, sb

    def _own_node(self, node: object, what: str) -> EmulatedNode:
        if not any(node is mine for mine in self._nodes):
            raise ValueError(f"{what}: {node!r:.80} is not a node of this emulated SAN")
        assert isinstance(node, EmulatedNode)
        return node

    def sockets(self) -> list[EmulatedSocket]:
        return [s for node in self._nodes for s in node.base_provider.sockets]

    def leaks(self) -> list[Leak]:
        found: list[Leak] = []
        for node in self._nodes:
            for sock in node.base_provider.sockets:
                found += [Leak(node.name, "registration", f"{reg!r} on {sock!r}")
                          for reg in node.base_provider.registrations(sock)]
            found += [Leak(node.name, "allocation", repr(thing)) for thing in node.base_proxy.live()]
        return found

    def reset(self) -> None:
        """Back to a clean SAN: links up, faults cleared, processes (and so sockets) gone, memory freed."""
        self.fabric.restore_all()
        for node in self._nodes:
            node.restart()
            node.base_proxy.reset()
            node.base_proxy.set_nolowmem(False)

    def close(self) -> None:
        self.reset()


class EmulatorFaults:
    """Fault injection on the emulated SAN."""

    def __init__(self, backend: EmulatorBackend) -> None:
        self._backend = backend

    def fail_allocations(self, node: Any, count: int, after: int = 0) -> None:
        self._backend._own_node(node, "fail_allocations").base_proxy.fail_next(count, after)

    def drop_link(self, a: Any, b: Any) -> None:
        a, b = (self._backend._own_node(n, "drop_link") for n in (a, b))
        self._backend.fabric.set_link(a.name, b.name, False, self._backend.sockets())

    def restore_link(self, a: Any, b: Any) -> None:
        a, b = (self._backend._own_node(n, "restore_link") for n in (a, b))
        self._backend.fabric.set_link(a.name, b.name, True, [])

    def hold(self, socket: Any) -> None:
        self._socket(socket, "hold").provider.hold(socket)

    def release(self, socket: Any) -> None:
        self._socket(socket, "release").provider.release_held(socket)

    def _socket(self, socket: object, what: str) -> EmulatedSocket:
        if not isinstance(socket, EmulatedSocket) or not any(socket.provider is n.base_provider
                                                            for n in self._backend.nodes):
            raise TypeError(f"{what} takes a socket of this emulated SAN, got {socket!r:.80}")
        return socket
