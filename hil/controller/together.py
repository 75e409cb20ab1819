"""Calls made together (pytest_san.protocols.Pipelining): each agent's calls written at once, in order, and
every agent's replies read in one round trip; each reply becomes what the stand-in's own method returns
(``remote.PIPELINED``). A call this module does not send so (another method, a provider wrapped by a
plugin) makes the whole list go one call at a time, as in-process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hil.controller.remote import PIPELINED, Remote, Session
from pytest_san.protocols import Call, Outcome
from pytest_san.together import one_by_one

if TYPE_CHECKING:
    from hil.rpc.codec import Encoded

Planned = tuple[Session, tuple[int, str, list["Encoded"]], Callable[[Session, Any], object]]


def plan(call: Call) -> Planned | None:
    """The request that makes ``call``, with the reply's conversion; None for a call not sent this way."""
    target, method, args = call
    if not isinstance(target, Remote):
        return None
    convert = PIPELINED.get((type(target), method))
    if convert is None:
        return None
    session = target.session
    return session, (target.oid, method, [session.codec.encode(a) for a in args]), convert


def together(calls: Sequence[Call]) -> list[Outcome]:
    planned = [plan(call) for call in calls]
    if any(p is None for p in planned):
        return one_by_one(calls)
    by_session: dict[int, tuple[Session, list[int]]] = {}
    for index, found in enumerate(planned):
        assert found is not None
        by_session.setdefault(id(found[0]), (found[0], []))[1].append(index)
    outcomes: list[Outcome] = [(False, RuntimeError("not answered"))] * len(calls)
    sent: list[tuple[Session, list[int]]] = []
    failure: Exception | None = None
    for session, indices in by_session.values():
        try:
            session.send_many([planned[i][1] for i in indices])  # type: ignore[index]
            sent.append((session, indices))
        except Exception as exc:  # a dead agent: the others' replies are still read, then this is raised
            failure = failure or exc
    for session, indices in sent:
        try:
            replies = session.collect()
        except Exception as exc:
            failure = failure or exc
            continue
        for index, (ok, value) in zip(indices, replies, strict=True):
            convert = planned[index][2]  # type: ignore[index]
            outcomes[index] = (True, convert(session, value)) if ok else (False, value)
    if failure is not None:
        raise failure
    return outcomes
