"""The ``hil`` backend: agents on lab hosts, reached over SSH or run locally."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hil.controller.client import AgentClient
from hil.controller.errors import AgentError
from hil.controller.leases import LeaseLog, LeasePolicy, Leaser
from hil.controller.remote import RemoteNode, RemoteProcess, RemoteSocket, Session
from hil.inventory import HostConfig
from hil.rpc.codec import referenced
from hil.transport import Transport, open_transport
from pytest_san.protocols import Backend, Faults, Node, Process, Provider, Proxy, Socket
from pytest_san.types import Leak

Wrappers = tuple[Callable[[Node, Provider], Provider], Callable[[Node, Proxy], Proxy]]
"""(wrap_provider(node, provider), wrap_proxy(node, proxy)): what replaces a node's provider and proxy."""


class Agent:
    """One host: its transport, its agent and the nodes the agent serves."""

    def __init__(self, host: HostConfig, connect: Callable[[HostConfig], Transport],
                 lease: Mapping[str, object] | None = None, wrap: Wrappers | None = None) -> None:
        self.host = host
        self._connect = connect
        self.lease = lease  # who we are, for the host's lease file (hil/controller/leases.py)
        self.wrap = wrap
        self.start()

    def start(self) -> None:
        """Connect and start the agent; ``HostBusy`` if another agent holds the host's lease."""
        self.transport = self._connect(self.host)
        try:
            self.client = AgentClient(self.host, self.transport, lease=self.lease)
        except BaseException:
            self.transport.close()
            raise
        self.session = Session(self.client)
        hello = self.client.hello
        self.engine = referenced(hello["engine_ref"])
        self.capabilities = frozenset(hello["capabilities"])
        self.nodes = [self.session.obj(n["node"], RemoteNode, n["name"], n["provider"], n["proxy"])
                      for n in hello["nodes"]]
        if self.wrap is not None:  # pytest_san_make_provider / _make_proxy, on the controller's stand-ins
            wrap_provider, wrap_proxy = self.wrap
            for node in self.nodes:
                node.proxy = wrap_proxy(node, node.proxy)
                node.provider = wrap_provider(node, node.provider)
        self.session.pinned = {self.engine, *(referenced(n[part]) for n in hello["nodes"]
                                              for part in ("node", "provider", "proxy"))}

    def call(self, method: str, *args: object) -> Any:
        """A method of the agent's engine: its answer as the agent sent it (decoded JSON: arbitrary)."""
        return self.session.call(self.engine, method, *args)

    def reset(self) -> None:
        """A live agent's reset (HilBackend.reset replaces a dead one, leasing its host again)."""
        self.call("reset")
        self.session.forget_unpinned()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        self.transport.close()


def combined_capabilities(per_agent: Sequence[frozenset[str]], nodes: int) -> frozenset[str]:
    """What every agent offers, plus "hil", plus "third_host" with three or more nodes (e.g. three verbs
    hosts: R2's "from another host" scenario can run); never "emulator" (the nodes are remote)."""
    caps = frozenset.intersection(*per_agent) | {"hil"}
    if nodes >= 3:
        caps |= {"third_host"}
    return caps - {"emulator"}


class HilBackend:
    """Nodes served by agents on the selected hosts; every call crosses the agent protocol."""

    name = "hil"

    def __init__(self, hosts: Sequence[HostConfig],
                 connect: Callable[[HostConfig], Transport] = open_transport, *,
                 leases: LeasePolicy | None = None, wrap: Wrappers | None = None) -> None:
        """Lease ``leases.count`` of ``hosts`` (default: all of them) and start their agents.

        A leased host is waited for (up to ``leases.timeout``), see hil/controller/leases.py. ``wrap``: (provider,
        proxy) wrappers applied to each node's stand-ins (the plugin's provider and proxy hooks).
        """
        if not hosts:
            raise ValueError("the hil backend needs at least one host")
        policy = leases or LeasePolicy()
        holder = policy.request.holder()
        self.lease_log = LeaseLog(policy.request.worker)
        self._leaser: Leaser[Agent] = Leaser(policy, lambda h: Agent(h, connect, holder, wrap), Agent.close)
        self.agents: list[Agent] = self._leaser.acquire(hosts)
        self.lease_log.start([a.host.name for a in self.agents])
        self._capabilities = combined_capabilities([a.capabilities for a in self.agents], len(self.nodes))

    @property
    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    @property
    def nodes(self) -> list[RemoteNode]:
        return [n for a in self.agents for n in a.nodes]

    @property
    def faults(self) -> RemoteFaults | None:
        return RemoteFaults(self) if "faults" in self._capabilities else None

    def agent_of(self, thing: object) -> Agent:
        session = thing.session if hasattr(thing, "session") else getattr(getattr(thing, "process", None),
                                                                          "session", None)
        for agent in self.agents:
            if agent.session is session:
                return agent
        raise ValueError(f"{thing!r:.80} is not an object of this hil backend")

    def connect_sockets(self, a: Process, b: Process) -> tuple[RemoteSocket, RemoteSocket]:
        if not isinstance(a, RemoteProcess) or not isinstance(b, RemoteProcess):
            raise TypeError(f"connect_sockets takes processes of this backend, got {a!r} and {b!r}")
        agent_a, agent_b = self.agent_of(a), self.agent_of(b)
        if agent_a is agent_b:
            ref_a, ref_b = agent_a.call("connect_local", a, b)
            sock_a: RemoteSocket = agent_a.session.obj(ref_a, RemoteSocket, a)
            sock_b: RemoteSocket = agent_b.session.obj(ref_b, RemoteSocket, b)
        else:
            # Across hosts the controller relays what each QP needs (QP number, PSN, GID).
            ref_a, info_a = agent_a.call("socket_create", a)
            sock_a = agent_a.session.obj(ref_a, RemoteSocket, a)
            ref_b, info_b = agent_b.call("socket_create", b)
            sock_b = agent_b.session.obj(ref_b, RemoteSocket, b)
            agent_a.call("socket_connect", sock_a, info_b)
            agent_b.call("socket_connect", sock_b, info_a)
        if agent_a is not agent_b:
            # Verbs has no disconnect event without a connection manager: relay closes between hosts.
            sock_a.on_close = lambda: agent_b.call("peer_closed", sock_b)
            sock_b.on_close = lambda: agent_a.call("peer_closed", sock_a)
        return sock_a, sock_b

    def leaks(self) -> list[Leak]:
        return [Leak(node, kind, detail) for agent in self.agents for node, kind, detail in agent.call("leaks")]

    def reset(self) -> None:
        for agent in self.agents:
            if agent.client.dead:
                # Its lease ended with it (when it was last heard from); a fresh agent leases the host again.
                self.lease_log.end(agent.client.last_reply)
                agent.close()
                self._leaser.restart(agent.host, agent.start)
                self.lease_log.start([a.host.name for a in self.agents])
            else:
                agent.reset()

    def close(self) -> None:
        self.lease_log.end()  # before the agents go: a record never claims more than was held
        for agent in self.agents:
            agent.close()


class RemoteFaults:
    """Fault injection carried out by the agents (capability ``"faults"``), checked as the emulator's."""

    def __init__(self, backend: HilBackend) -> None:
        self._backend = backend

    def _node(self, node: object, what: str) -> RemoteNode:
        if not any(node is mine for mine in self._backend.nodes):
            raise ValueError(f"{what}: {node!r:.80} is not a node of this hil backend")
        assert isinstance(node, RemoteNode)
        return node

    def _socket(self, socket: object, what: str) -> RemoteSocket:
        if not isinstance(socket, RemoteSocket) or not any(socket.session is a.session for a in self._backend.agents):
            raise TypeError(f"{what} takes a socket of this hil backend, got {socket!r:.80}")
        return socket

    def fail_allocations(self, node: Node, count: int) -> None:
        mine = self._node(node, "fail_allocations")
        self._backend.agent_of(mine).call("faults", "fail_allocations", mine, count)

    def drop_link(self, a: Node, b: Node) -> None:
        self._link("drop_link", a, b)

    def restore_link(self, a: Node, b: Node) -> None:
        self._link("restore_link", a, b)

    def _link(self, name: str, a: Node, b: Node) -> None:
        node_a, node_b = self._node(a, name), self._node(b, name)
        if node_a.session is not node_b.session:
            # Each emulator agent is a SAN of its own: no connection joins two hosts (connect_sockets
            # refuses), so a link between them carries nothing to drop or restore.
            return
        self._backend.agent_of(node_a).call("faults", name, node_a, node_b)

    def hold(self, socket: Socket) -> None:
        mine = self._socket(socket, "hold")
        self._backend.agent_of(mine).call("faults", "hold", mine)

    def release(self, socket: Socket) -> None:
        mine = self._socket(socket, "release")
        self._backend.agent_of(mine).call("faults", "release", mine)


# mypy checks the backend and its faults against the protocols they implement (no runtime cost).
if TYPE_CHECKING:
    def _is_backend(b: HilBackend) -> Backend: return b
    def _is_faults(f: RemoteFaults) -> Faults: return f


__all__ = ["AgentError", "HilBackend"]
