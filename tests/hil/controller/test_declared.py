"""A remote method is declared once, where its stand-in defines it (hil/controller/declared.py): that body is the
direct call and its batched form, so adding one means editing one file. Checked without an agent: a fake
client answers and counts the round trips."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

import hil.controller
from hil.controller.backend import HilBackend
from hil.controller.client import AgentClient, Outcome
from hil.controller.declared import WAYS, body_of, declared, local, remote, remote_waves
from hil.controller.remote import Remote, RemoteBuffer, RemoteProcess, RemoteProvider, Session
from hil.controller.together import make_together
from pytest_san import Access
from pytest_san.batch import Call, batch


class FakeClient:
    """An agent's client: answers each request with ``answer(obj, method, args)`` (an exception is its error)."""

    def __init__(self, answer: Callable[[object, str, list[Any]], object]) -> None:
        self.answer = answer
        self.host = SimpleNamespace(name="fake")
        self.where, self.dead = "host fake", None
        self.gone = False  # an agent that no longer answers: collect raises
        self.written: list[tuple[object, str, list[Any]]] = []
        self.round_trips = 0
        self._unread: list[tuple[object, str, list[Any]]] = []

    def send(self, obj: object, method: str, args: Sequence[Any]) -> int:
        self.written.append((obj, method, list(args)))
        self._unread.append((obj, method, list(args)))
        return len(self.written)

    def collect(self, timeout: float | None = None) -> list[Outcome]:
        pending, self._unread = self._unread, []
        self.round_trips += bool(pending)
        if self.gone:
            raise ConnectionError("agent gone")
        outcomes: list[Outcome] = []
        for request in pending:
            try:
                outcomes.append((True, self.answer(*request)))
            except Exception as exc:
                outcomes.append((False, exc))
        return outcomes

    def call(self, obj: object, method: str, *args: Any, timeout: float | None = None) -> Any:
        self.send(obj, method, args)
        [(ok, value)] = self.collect(timeout)
        if not ok:
            raise value
        return value


class Together:
    """A backend that makes batches as hil does."""

    def make_together(self, calls: Sequence[Call]) -> list[Outcome]:
        return make_together(calls)


def _session(answer: Callable[[object, str, list[Any]], object]) -> tuple[Session, FakeClient]:
    client = FakeClient(answer)
    return Session(cast(AgentClient, client)), client


def _stand_ins() -> list[type]:
    """Every stand-in class of hil/controller: what is declared, found by walking the package."""
    found: set[type] = {RemoteBuffer}
    for module in pkgutil.iter_modules(hil.controller.__path__, "hil.controller."):
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(cls, Remote) and cls is not Remote:
                found.add(cls)
    return sorted(found, key=lambda cls: cls.__name__)


@pytest.mark.parametrize("cls", _stand_ins(), ids=lambda cls: cls.__name__)
def test_every_public_method_of_every_stand_in_is_declared(cls: type) -> None:
    assert declared(cls) is cls
    bodies = [body_of(member) for member in vars(cls).values()]
    assert all(WAYS[body] is cls for body in bodies if body is not None)
    assert any(bodies)  # a stand-in asks its agent something


def test_the_backends_own_remote_methods_are_declared_entries_too() -> None:
    for method in (HilBackend.connect_sockets, HilBackend.spawn_observed):
        body = body_of(method)
        assert body is not None and WAYS[body] is HilBackend


def test_a_method_left_undeclared_is_an_error_at_import() -> None:
    with pytest.raises(TypeError, match=r"Grown: grow, size not declared @remote"):
        @declared
        class Grown(Remote):
            @remote
            def asked(self) -> int:
                return int(self._call("asked"))

            def grow(self) -> None:
                self._call("grow")

            @property
            def size(self) -> int:
                return 1

            @local
            def here(self) -> int:
                return 2


def test_a_declared_method_made_together_asks_what_its_direct_call_asks() -> None:
    """One body: the requests written for calls made together are those of the direct calls, in one round
    trip instead of three; the outcomes are theirs, a bad argument's error included, nothing sent for it."""
    answers = {"alloc": {"$buf": [7, 4096, 64]}, "buffer_read": b"x" * 8, "register_memory": [1, "k"]}
    session, client = _session(lambda obj, method, args: answers[method])
    process = session.obj({"$o": 7, "type": "process"}, RemoteProcess, None)
    provider = RemoteProvider(session, 3)
    buf = process.alloc(64)
    alone = [buf.read(8), provider.register_memory(cast(Any, 5), buf, Access.READ)]
    with pytest.raises(ValueError, match="outside"):
        buf.read(8, 60)
    written, client.written, client.round_trips = client.written, [], 0
    with batch(Together()) as b:
        made = [b.call(process.alloc, 64), b.call(buf.read, 8), b.call(provider.register_memory, cast(Any, 5), buf,
                                                                        Access.READ), b.call(buf.read, 8, 60)]
    assert client.round_trips == 1 and client.written == written
    assert [made[1].value, made[2].value] == alone == [b"x" * 8, (1, "k")]
    assert made[0].value == buf and isinstance(made[3].error, ValueError)


@declared
class Twice(Remote):
    """A body that asks twice, declared so (``waves``) or not (``undeclared``)."""

    @remote_waves
    def waves(self) -> int:
        return int(self._call("first")) + int(self._call("second"))

    @remote
    def undeclared(self) -> int:
        return int(self._call("first")) + int(self._call("second"))


def test_a_body_that_asks_twice_goes_in_two_waves_when_declared_so() -> None:
    session, client = _session(lambda obj, method, args: {"first": 1, "second": 2}[method])
    one, two = Twice(session, 1), Twice(session, 2)
    assert one.waves() == one.undeclared() == 3 and client.round_trips == 4  # direct: one round trip per ask
    client.round_trips = 0
    with batch(Together()) as b:
        both = [b.call(one.waves), b.call(two.waves)]
    assert [later.value for later in both] == [3, 3] and client.round_trips == 2
    with batch(Together()) as b:
        wrong = b.call(one.undeclared)
    assert isinstance(wrong.error, RuntimeError) and "@remote_waves" in str(wrong.error)


def test_a_call_whose_answer_nobody_reads_joins_the_batch_ending_the_test() -> None:
    """``@remote_void`` while the session defers: nothing is written until that batch is made, then the call goes
    in its write; its error is that batch's outcome."""
    session, client = _session(lambda obj, method, args: None)
    provider = RemoteProvider(session, 3)
    with batch(Together()) as ending:
        session.deferred = ending
        provider.deregister_memory(cast(Any, 5), 9)
        session.deferred = None
        assert client.written == []
    assert [method for _, method, _ in client.written] == ["deregister_memory"] and ending.outcomes == [(True, None)]


def test_answers_asked_ahead_answer_the_same_question_only() -> None:
    session, client = _session(lambda obj, method, args: True)
    process = session.obj({"$o": 7, "type": "process"}, RemoteProcess, None)
    session.ahead = {(7, "alive"): ((), (True, False))}
    assert [process.alive, client.written] == [False, []]
    session.ahead = None
    assert [process.alive, len(client.written)] == [True, 1]


def test_connects_across_hosts_go_in_two_waves_however_many_pairs() -> None:
    """``connect_sockets`` made together: every host's listens in one write, then every host's connects; a connect
    that fails closes the socket its peer listened on (one more round trip there), and is that pair's outcome."""
    from hil.controller.engine import RemoteEngine

    oids = iter(range(100, 200))

    def answer(obj: object, method: str, args: list[Any]) -> object:
        if method == "socket_listen":
            return [{"$o": next(oids), "type": "socket"}, "where"]
        if method == "socket_connect":
            if args[1] == "refused":
                raise ConnectionRefusedError("no one listens")
            return {"$o": next(oids), "type": "socket"}
        return None

    agents = []
    for _ in ("one", "two"):
        session, client = _session(answer)
        agents.append(SimpleNamespace(session=session, client=client, engine=1,
                                      remote_engine=RemoteEngine(session, 1, [])))
    backend = HilBackend.__new__(HilBackend)  # its agents only: connect_sockets needs nothing else
    backend.agents = cast(Any, agents)
    p, q = (agent.session.obj({"$o": 7, "type": "process"}, RemoteProcess,
                              SimpleNamespace(own_provider=RemoteProvider(agent.session, 3))) for agent in agents)
    with batch(backend) as b:
        pairs = [b.call(backend.connect_sockets, p, q), b.call(backend.connect_sockets, q, p),
                 b.call(backend.connect_sockets, p, q)]
    assert [agent.client.round_trips for agent in agents] == [2, 2]
    assert [[m for _, m, _ in agent.client.written] for agent in agents] == [
        ["socket_listen", "socket_connect", "socket_connect"], ["socket_listen", "socket_listen", "socket_connect"]]
    (a, b_end), (c, d) = pairs[0].value, pairs[1].value
    assert (a.process, b_end.process, c.process, d.process) == (p, q, q, p) and a.on_close is not None
    agents[0].client.answer = lambda obj, method, args: answer(obj, method, [*args[:1], "refused"])
    with batch(backend) as b:
        failed = b.call(backend.connect_sockets, p, q)
    assert isinstance(failed.error, ConnectionRefusedError)
    assert [agent.client.round_trips for agent in agents] == [3, 4]
    assert [m for _, m, _ in agents[1].client.written][-2:] == ["socket_listen", "close_socket"]


def _paired(refuse: set[str]) -> tuple[list[FakeClient], list[Session], list[Any], list[RemoteProvider]]:
    """Two hosts' sessions with one connected pair across them (each end relays its close to the other's host);
    each agent refuses the methods in ``refuse``."""
    from hil.controller.connecting import relay
    from hil.controller.remote import RemoteSocket

    def answer(obj: object, method: str, args: list[Any]) -> object:
        if method in refuse:
            raise OSError(f"{method} refused")
        return 0

    sessions, clients = zip(*(_session(answer) for _ in range(2)), strict=True)
    agents = [SimpleNamespace(session=session, engine=1) for session in sessions]
    ends = [session.obj({"$o": 20 + i, "type": "socket"}, RemoteSocket, None) for i, session in enumerate(sessions)]
    relay(cast(Any, agents[0]), ends[0], cast(Any, agents[1]), ends[1])
    return list(clients), list(sessions), ends, [RemoteProvider(session, 3) for session in sessions]


def _methods(client: FakeClient) -> list[str]:
    return [method for _, method, _ in client.written]


def test_a_refused_close_tells_the_peers_host_nothing() -> None:
    """Found on an rxe lab (issue 38): a close told the peer's host before it was made, so a refused close of
    another host's socket still reset its peer (test_every_argument[close_socket])."""
    clients, _, ends, providers = _paired({"close_socket"})
    with pytest.raises(OSError, match="refused"):
        providers[0].close_socket(ends[0])
    providers[1].getsockopt(ends[1], 0)
    assert _methods(clients[1]) == ["getsockopt"]


def test_both_ends_closed_together_each_host_closes_its_own_before_hearing_its_peer() -> None:
    """Found on an rxe lab (issue 38): with the relay ahead of the close, a host closing both ends in one batch
    heard its peer's close first, and a pending receive completed CONNECTION_RESET, not ABORTED (R11; the model's
    regression 'an unknown handle queued behind a waiting send')."""
    clients, _, ends, providers = _paired(set())
    with batch(Together()) as b:
        for provider, end in zip(providers, ends, strict=True):
            b.call(provider.close_socket, end)
    assert [_methods(client) for client in clients] == [["close_socket"], ["close_socket"]]
    for provider, end in zip(providers, ends, strict=True):
        provider.getsockopt(end, 0)
    assert [_methods(client) for client in clients] == [["close_socket", "peer_closed", "getsockopt"]] * 2


def test_a_relay_its_hosts_reset_made_moot_is_not_sent() -> None:
    """A close at the end of a test relays to a socket the peer's reset drops in the same round trip: sent with
    the next test's first request it named an object the agent no longer had ('no object 6 on this agent')."""
    clients, sessions, ends, providers = _paired(set())
    providers[0].close_socket(ends[0])
    sessions[1].forget_unpinned()  # what the peer host's reset does
    providers[1].getsockopt(ends[1], 0)
    assert _methods(clients[1]) == ["getsockopt"]


def test_a_reset_that_fails_on_one_host_keeps_the_other_hosts_readings() -> None:
    """Every host reset in one batch: an agent that answers the reset with an error, or not at all, leaves the
    others reset and their kernel witness's readings filed; the failure is raised after them."""
    from hil.controller.engine import RemoteEngine
    from hil.controller.kernel import KernelLog

    def answer(obj: object, method: str, args: list[Any]) -> object:
        if method == "reset" and obj == 2:
            raise OSError("the reset failed")
        return [{"at": "a test"}] if method == "kernel_readings" else None

    agents = []
    for engine in (1, 2, 3):
        session, client = _session(answer)
        client.gone = engine == 3
        agents.append(SimpleNamespace(session=session, client=client, engine=engine, nodes=[], witnessed=True,
                                      host=SimpleNamespace(name=f"lab{engine}"),
                                      remote_engine=RemoteEngine(session, engine, [])))
    backend = HilBackend.__new__(HilBackend)  # its agents only: a reset needs nothing else
    backend.agents, backend.broken, backend.kernel_log = cast(Any, agents), None, KernelLog()
    with pytest.raises(ConnectionError, match="agent gone"):
        backend.reset()
    assert [[m for _, m, _ in agent.client.written] for agent in agents] == [["reset", "kernel_readings"]] * 3
    assert backend.kernel_log._pending == {"lab1": [{"at": "a test"}], "lab2": [{"at": "a test"}], "lab3": []}


def test_spawn_observed_asks_the_node_and_gives_its_stand_in() -> None:
    from hil.controller.observed import RemoteObserved
    from hil.controller.remote import RemoteNode

    session, client = _session(lambda obj, method, args: {"$o": 40, "type": "observed"})
    node = RemoteNode(session, 5, "n0", {"$o": 6, "type": "provider"}, {"$o": 8, "type": "proxy"})
    observed = HilBackend.__new__(HilBackend).spawn_observed(node, "rsockets")
    assert client.written == [(5, "spawn_observed", ["rsockets"])]
    assert isinstance(observed, RemoteObserved) and observed.oid == 40
