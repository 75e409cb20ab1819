"""Connected socket pairs, many at once: every host's part of each connect written together.

A pair on one host is one ``connect_local``; across hosts the peer listens (its device's address and a port)
and the connecting host connects to that address through the RDMA connection manager, the peer's child
accepting by itself. So any number of pairs cost two round trips: every host's listens (and local connects)
in one write, then every host's connects. A connect that fails closes the socket its peer listened on (a
failed connect leaves nothing behind).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hil.controller.client import Outcome
from hil.controller.remote import RemoteProcess, RemoteSocket, Session

if TYPE_CHECKING:
    from hil.controller.backend import Agent
    from hil.rpc.codec import Encoded

Pair = tuple[RemoteSocket, RemoteSocket]


@dataclasses.dataclass(frozen=True)
class _Step:
    """One pair's request to an agent's engine (the wire's method name and encoded arguments)."""

    pair: int
    agent: Agent
    method: str
    args: list[Encoded]
    listening: RemoteSocket | None = None  # a connect's: the socket its peer listens on


def connect_many(agent_of: Callable[[object], Agent], pairs: Sequence[tuple[RemoteProcess, RemoteProcess]]
                 ) -> list[Outcome]:
    """(True, (socket of a, socket of b)) or (False, the error) for each (a, b), in two round trips at most."""
    outcomes: list[Outcome | None] = [None] * len(pairs)
    agents = [(agent_of(a), agent_of(b)) for a, b in pairs]
    first: list[_Step] = []
    for index, ((a, b), (agent_a, agent_b)) in enumerate(zip(pairs, agents, strict=True)):
        codec = agent_a.session.codec
        if agent_a is agent_b:
            first.append(_Step(index, agent_a, "connect_local", [codec.encode(a), codec.encode(b)]))
        else:
            first.append(_Step(index, agent_b, "socket_listen", [agent_b.session.codec.encode(b)]))
    second: list[_Step] = []
    for step, (ok, value) in zip(first, _together(first), strict=True):
        a, b = pairs[step.pair]
        if not ok:
            outcomes[step.pair] = (False, value)
        elif step.method == "connect_local":
            ref_a, ref_b = value
            session = step.agent.session
            outcomes[step.pair] = (True, (session.obj(ref_a, RemoteSocket, a), session.obj(ref_b, RemoteSocket, b)))
        else:
            ref_b, where = value
            agent_a = agents[step.pair][0]
            second.append(_Step(step.pair, agent_a, "socket_connect", [agent_a.session.codec.encode(a), where],
                                step.agent.session.obj(ref_b, RemoteSocket, b)))
    for step, (ok, value) in zip(second, _together(second), strict=True):
        index, agent_a, listening = step.pair, step.agent, step.listening
        assert listening is not None
        a, b = pairs[index]
        agent_b = agents[index][1]
        if not ok:
            with contextlib.suppress(Exception):  # a failed connect leaves nothing behind
                b.node.provider.close_socket(listening)
            outcomes[index] = (False, value)
            continue
        sock_a = agent_a.session.obj(value, RemoteSocket, a)
        relay(agent_a, sock_a, agent_b, listening)
        outcomes[index] = (True, (sock_a, listening))
    return [o if o is not None else (False, RuntimeError("not answered")) for o in outcomes]


def relay(agent_a: Agent, sock_a: RemoteSocket, agent_b: Agent, sock_b: RemoteSocket) -> None:
    """A close of either end is told to the other's host, with its next request: CM tells a survivor its peer's
    close, the relay stays for a host that vanished (a no-op otherwise)."""
    sock_a.on_close = lambda: agent_b.session.queue(agent_b.engine, "peer_closed", sock_b)
    sock_b.on_close = lambda: agent_a.session.queue(agent_a.engine, "peer_closed", sock_a)


def _together(requests: list[_Step]) -> list[Outcome]:
    """Engine requests, each agent's written at once, every agent's replies read: one round trip."""
    by_session: dict[int, tuple[Session, list[int]]] = {}
    for index, step in enumerate(requests):
        session = step.agent.session
        by_session.setdefault(id(session), (session, []))[1].append(index)
        session.send_one(step.agent.engine, step.method, step.args)
    outcomes: list[Outcome] = [(False, RuntimeError("not answered"))] * len(requests)
    failure: Exception | None = None
    for session, indices in by_session.values():
        try:
            for index, outcome in zip(indices, session.collect(), strict=True):
                outcomes[index] = outcome
        except Exception as exc:  # a dead agent: the others are still read, then this is raised
            failure = failure or exc
    if failure is not None:
        raise failure
    return outcomes

