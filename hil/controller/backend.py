"""The ``hil`` backend: agents on lab hosts, reached over SSH or run locally."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from hil.agent.kmsg import console_trouble
from hil.controller.client import AgentClient, Outcome
from hil.controller.connecting import connect
from hil.controller.declared import collected, remote, remote_waves
from hil.controller.engine import RemoteEngine
from hil.controller.errors import AgentError, BackendBroken
from hil.controller.kernel import KernelLog
from hil.controller.leases import LeaseLog, LeasePolicy, Leaser
from hil.controller.observed import SPAWN_TIMEOUT, RemoteObserved
from hil.controller.remote import RemoteNode, RemoteOperation, RemoteProcess, RemoteSocket, Session
from hil.controller.together import make_together
from hil.controller.workarounds import applied_on
from hil.inventory import HostConfig
from hil.rpc.codec import referenced
from hil.transport import Transport, open_transport
from pytest_san.batch import Batch, Batching, Later, batch, is_alive, is_closed, is_done, raise_first, values
from pytest_san.batch import Call as BatchCall
from pytest_san.deviations import Deviation
from pytest_san.spi.contract import Leak
from pytest_san.spi.protocols import (
    Backend,
    Faults,
    ModelBudget,
    Node,
    Process,
    Provider,
    Proxy,
    Socket,
)

log = logging.getLogger(__name__)  # resets, and dead agents replaced

Wrappers = tuple[Callable[[Node, Provider], Provider], Callable[[Node, Proxy], Proxy]]
"""(wrap_provider(node, provider), wrap_proxy(node, proxy)): what replaces a node's provider and proxy."""


class Agent:
    """One host: its transport, its agent and the nodes the agent serves."""

    def __init__(self, host: HostConfig, connect: Callable[[HostConfig], Transport],
                 lease: Mapping[str, object] | None = None, wrap: Wrappers | None = None) -> None:
        self.host = host
        self._connect = connect
        self.lease = lease  # who we are, for the host's lease (hil/controller/leases.py)
        self.wrap = wrap
        self.earlier_round_trips = 0  # of the agents this host had before (a dead one is replaced)
        self.start()

    @property
    def round_trips(self) -> int:
        """Times the controller waited for this host's agents (``AgentClient.round_trips``), all of them."""
        return self.earlier_round_trips + self.client.round_trips

    def start(self) -> None:
        """Connect and start the agent; ``HostBusy`` if another agent holds the host's lease."""
        previous: AgentClient | None = getattr(self, "client", None)
        if previous is not None:
            self.earlier_round_trips += previous.round_trips
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
        self.remote_engine = RemoteEngine(self.session, self.engine, self.nodes)
        if self.wrap is not None:  # pytest_san_make_provider / _make_proxy, on the controller's stand-ins
            wrap_provider, wrap_proxy = self.wrap
            for node in self.nodes:
                node.proxy = wrap_proxy(node, node.proxy)
                node.provider = wrap_provider(node, node.provider)
        self.session.pinned = {self.engine, *(referenced(n[part]) for n in hello["nodes"]
                                              for part in ("node", "provider", "proxy"))}
        self.kernel_release = hello.get("kernel")  # the host's uname -r
        witness = hello.get("kernel_witness")  # the verbs engine reads the kernel's RDMA resource tracking
        self.witness: dict[str, Any] | None = witness if isinstance(witness, dict) else None
        self.workarounds = hello.get("workarounds")  # the kernel workarounds the engine applies on this host
        self.proxy = hello.get("proxy")  # which proxy driver runs there: the kernel module or the stand-in

    @property
    def witnessed(self) -> bool:
        """Whether this host's agent reads the kernel's record of its processes' RDMA objects."""
        return self.witness is not None and not self.witness.get("unavailable")

    def call(self, method: str, *args: object) -> Any:
        """A method of the agent's engine by name, for tools and tests: its answer as the agent sent it (decoded
        JSON: arbitrary). The harness's own are ``remote_engine``'s declared methods."""
        return self.session.call(self.engine, method, *args)

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


def _console_trouble(host: HostConfig) -> str:
    """What a dead host's serial console shows of an oops or panic, where the inventory names its console
    (``san_console_log``: a `san-hil lab` guest's), as lines to add to the error; else nothing."""
    path = host.extra.get("san_console_log")
    if not isinstance(path, str):
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (256 << 10)))  # the end: a long run's console is large
            lines = console_trouble(f.read().decode(errors="replace"))
    except OSError:
        return ""
    return "".join(f"\n  {line}" for line in ["its console shows:", *lines]) if lines else ""


def _ending(b: Batch, agent: Agent) -> tuple[Later[None], Later[Any] | None]:
    """``agent``'s reset in ``b``, with the questions for each node's new default process (what a reset keeps or
    replaces) and last the kernel witness's readings since the previous reset: (the reset, the readings)."""
    log.debug("%s: reset", agent.client.where)
    reset = b.call(agent.remote_engine.reset)
    for node in agent.nodes:
        b.call(node.default_after_reset)  # one that fails is asked again when it is wanted
    return reset, b.call(agent.remote_engine.kernel_readings) if agent.witnessed else None


def _read(agent: Agent, readings: Later[Any] | None) -> None:
    """Say so when the kernel witness's readings were lost (those it brought are ``remote_engine.readings``)."""
    if readings is not None and readings.error is not None:
        log.warning("%s: the kernel witness's readings were lost: %s", agent.client.where, readings.error)


@collected
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
        self.broken: str | None = None  # why a dead agent could not be started again (BackendBroken)
        self._leaser: Leaser[Agent] = Leaser(policy, lambda h: Agent(h, connect, holder, wrap), Agent.close)
        self.agents: list[Agent] = self._leaser.acquire(hosts)
        self.lease_log.start([a.host.name for a in self.agents])
        self.kernel_log = KernelLog()  # the report's "kernel" and "kernel_resources"
        for agent in self.agents:
            self.kernel_log.host(agent.host.name, agent.kernel_release, agent.witness, agent.workarounds,
                                     agent.proxy)
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

    def known_differences(self) -> list[Deviation]:
        """The kernel workarounds the hosts' engines apply, for the verdict's table of deviations
        (pytest_san.deviations.ReportsDifferences)."""
        return applied_on(self.kernel_log.record)

    def model_budget(self) -> ModelBudget:
        """The reference model in the suite's run on lab hosts (pytest_san.spi.protocols.DeclaresModelBudget): a
        sequence costs about 1.2 s on rxe guests under TCG (docs/model.md), so 16 sequences of 20 steps, none
        started after a minute. Every check is a round trip, so a step checks only what it could change; a
        completion may take a NIC's retries (seconds); a shrink replays at most 60 times. On NICs (the verbs
        engine on every host) the steps that cost seconds there are avoided."""
        nics = all(agent.host.engine == "verbs" for agent in self.agents)
        return ModelBudget(sequences=16, steps=20, deadline=60.0, full_checks=False, call_timeout=30.0,
                           shrink_replays=60, avoid_slow_steps=nics)

    def agent_of(self, thing: object) -> Agent:
        session = thing.session if hasattr(thing, "session") else getattr(getattr(thing, "process", None),
                                                                          "session", None)
        for agent in self.agents:
            if agent.session is session:
                return agent
        raise ValueError(f"{thing!r:.80} is not an object of this hil backend")

    @remote_waves
    def connect_sockets(self, a: Process, b: Process) -> tuple[RemoteSocket, RemoteSocket]:
        # hil/controller/connecting.py: made together, every host's listens in one write, then every host's
        # connects, however many pairs.
        return connect(self.agent_of, a, b)

    def make_together(self, calls: Sequence[BatchCall]) -> list[Outcome]:
        """A batch's calls made together, one round trip per host and wave (pytest_san.batch.Batching)."""
        return make_together(calls)

    @remote
    def spawn_observed(self, node: Node, program: str) -> RemoteObserved:
        """A process running ``program`` on ``node``'s host, under observation (pytest_san.observed.Observing)."""
        if not isinstance(node, RemoteNode):
            raise TypeError(f"spawn_observed takes a node of this backend, got {node!r:.80}")
        return node.session.obj(node._call("spawn_observed", program, timeout=SPAWN_TIMEOUT), RemoteObserved)

    def leaks(self) -> list[Leak]:
        """What every agent still holds, all asked at once (one round trip). An agent that answers with an error
        leaves the others asked and read; the first such failure is raised after them."""
        with batch(self) as b:
            asked = [b.call(agent.remote_engine.leaks) for agent in self.agents]
        return self._oopsed([leak for leaks in values(asked) for leak in leaks])

    def _oopsed(self, found: list[Leak]) -> list[Leak]:
        """``found`` without what a host's kernel log showed (kind "oops": an oops, BUG, warning or panic in its
        kernel since the last look): that ends the backend, as a dead agent does, with the report's first lines
        (BackendBroken at the reset that follows)."""
        oops = [leak for leak in found if leak.kind == "oops"]
        if oops and self.broken is None:
            first = oops[0]
            lines = "\n  ".join(first.detail.splitlines())
            self.broken = (f"{first.node}: its kernel reported trouble during this test (read from its kernel log); "
                           f"no more SAN tests run on it:\n  {lines}")
        return [leak for leak in found if leak.kind != "oops"]

    def round_trips(self) -> dict[str, int]:
        """Per host: times the controller has waited for its agent's replies so far (pipelined requests
        answered together count once). Machine-independent: what the remote path costs, in round trips."""
        return {a.host.name: a.round_trips for a in self.agents}

    def end_test(self, close: Callable[[], None] | None = None) -> tuple[list[Leak], list[Exception]]:
        """The end of a test: ``close()`` (the switch closing what the test left), the leak check and the
        reset, in at most two round trips per host (one without ``close``), every step still done in order.

        Before ``close`` the agents are asked together what closing reads (``_ask_ahead``); during it, the calls
        whose answer nobody reads (deregistrations, close_socket: ``@remote_void``) join the batch that ends the
        test, with every host's ``leaks``, ``reset`` and its nodes' ``default_process`` (a relayed peer close goes
        ahead of them). Returns (the leaks, the errors: of ``close`` itself, of each call it deferred and of each
        relay, in order). An agent that fails raises AgentError after every host was reset (a dead agent
        replaced), as ``leaks()`` and ``reset()`` do.
        """
        errors: list[Exception] = []
        live = [a for a in self.agents if not a.client.dead]
        ended: list[tuple[Agent, Later[list[Leak]], Later[None], Later[Any] | None]] = []
        try:
            with batch(self) as b:
                if close is not None:
                    self._ask_ahead(live)
                    for agent in live:
                        agent.session.deferred = b
                    try:
                        close()
                    except Exception as exc:  # the test's own failure stays the test's; this is the harness's
                        errors.append(exc)
                    finally:
                        for agent in live:
                            agent.session.deferred = agent.session.ahead = None
                deferred = len(b.calls)
                ended = [(agent, b.call(agent.remote_engine.leaks), *_ending(b, agent)) for agent in live]
            errors += [value for ok, value in cast("list[Outcome]", b.outcomes[:deferred]) if not ok]
            for agent, _, _, readings in ended:
                _read(agent, readings)
            leaks = self._oopsed([leak for _, asked, _, _ in ended for leak in asked.value])
            raise_first([reset for _, _, reset, _ in ended])
        finally:
            for agent in self.agents:
                errors += [error for _, error in agent.session.deferred_errors]
                agent.session.deferred_errors.clear()
                agent.session.deferred = agent.session.ahead = None
                self._take_readings(agent)
            self._replace_dead()
        return leaks, errors

    def _take_readings(self, agent: Agent) -> None:
        self.kernel_log.add(agent.host.name, agent.remote_engine.readings)
        agent.remote_engine.readings = []

    def _ask_ahead(self, agents: Sequence[Agent]) -> None:
        """What closing reads (every pending operation's completion, every socket's state, every process's
        liveness), asked together, hosts at once: the replies answer those reads while ``close`` runs
        (``Session.ahead``). An answer that changes meanwhile (an operation completes) is answered as it was;
        closing then leaves a registration to close_socket, which releases it (R11), so nothing leaks unseen.
        The kernel witness reads the host while the test's sockets are open, in the same round trip."""
        for agent in agents:
            agent.session.ahead = {}
        with batch(self) as b:
            for agent in agents:
                for obj in agent.session.objects():
                    if isinstance(obj, RemoteOperation) and obj.pending:
                        b.call(is_done, obj)
                    elif isinstance(obj, RemoteSocket):
                        b.call(is_closed, obj)
                    elif isinstance(obj, RemoteProcess):
                        b.call(is_alive, obj)
            readings = [(agent, b.call(agent.remote_engine.kernel_reading, "before the test's cleanup"))
                        for agent in agents if agent.witnessed]
        for agent, reading in readings:
            if reading.error is not None:
                log.warning("%s: the kernel witness could not read: %s", agent.client.where, reading.error)

    def end_kernel_record(self) -> None:
        """The session's end: each host's agent closes its processes and reads what the kernel still holds
        of theirs (one round trip per host, all hosts at once). The agents serve nothing afterwards."""
        live = [a for a in self.agents if a.witnessed and not a.client.dead]
        for agent in live:
            agent.session.send_many([(agent.engine, "end_session", [])])
        for agent in live:
            try:
                [(ok, reading)] = agent.session.collect()
            except Exception as exc:  # a host gone at the end: the record says so, the run goes on
                reading, ok = {"at": "the session's end", "unavailable": str(exc), "findings": []}, True
            if not ok:
                reading = {"at": "the session's end", "unavailable": str(reading), "findings": []}
            self.kernel_log.session_end(agent.host.name, reading)

    def _replace_dead(self) -> None:
        if self.broken is not None:
            raise BackendBroken(self.broken)
        for agent in self.agents:
            if agent.client.dead:
                died = agent.client.dead.partition("\n")[0]
                log.warning("%s: replacing the dead agent (%s)", agent.client.where, died)
                # Its lease ended with it (when it was last heard from); a fresh agent leases the host again.
                self.lease_log.end(agent.client.last_reply)
                agent.close()
                try:
                    self._leaser.restart(agent.host, agent.start)
                except Exception as exc:  # said once; every later test would only try again, and fail so
                    why = (str(exc).strip() or type(exc).__name__).partition("\n")[0]
                    self.broken = (f"{agent.client.where}: its agent died ({died}) and could not be started "
                                   f"again: {why}{_console_trouble(agent.host)}")
                    raise BackendBroken(self.broken) from exc
                self.lease_log.start([a.host.name for a in self.agents])
                self.kernel_log.host(agent.host.name, agent.kernel_release, agent.witness, agent.workarounds,
                                     agent.proxy)

    def reset(self) -> None:
        """Every agent reset, hosts at once (one round trip); the first reset's error raised after them."""
        self._replace_dead()
        try:
            with batch(self) as b:
                ended = [(agent, *_ending(b, agent)) for agent in self.agents]
        finally:
            for agent in self.agents:
                self._take_readings(agent)
        for agent, _, readings in ended:
            _read(agent, readings)
        raise_first([reset for _, reset, _ in ended])

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

    def fail_allocations(self, node: Node, count: int, after: int = 0) -> None:
        mine = self._node(node, "fail_allocations")
        self._backend.agent_of(mine).remote_engine.faults("fail_allocations", mine, count, after)

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
        self._backend.agent_of(node_a).remote_engine.faults(name, node_a, node_b)

    def hold(self, socket: Socket) -> None:
        mine = self._socket(socket, "hold")
        self._backend.agent_of(mine).remote_engine.faults("hold", mine)

    def release(self, socket: Socket) -> None:
        mine = self._socket(socket, "release")
        self._backend.agent_of(mine).remote_engine.faults("release", mine)


# mypy checks the backend and its faults against the protocols they implement (no runtime cost).
if TYPE_CHECKING:
    def _is_backend(b: HilBackend) -> Backend: return b
    def _is_batching(b: HilBackend) -> Batching: return b
    def _is_faults(f: RemoteFaults) -> Faults: return f


__all__ = ["AgentError", "BackendBroken", "HilBackend"]
