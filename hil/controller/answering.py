"""Questions asked together: the read-only calls a checker makes in a row (socket states, registrations,
buffer bytes, proxy counts, whether a process is alive, completions), written to every agent at once and their
replies read in one round trip; the stand-ins answer them from ``Session.answered`` until the block ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from hil.controller.client import Outcome
from hil.controller.remote import (
    RemoteBuffer,
    RemoteOperation,
    RemoteProcess,
    RemoteProvider,
    RemoteProxy,
    RemoteSocket,
    Session,
    question_key,
)
from pytest_san.protocols import Question

if TYPE_CHECKING:
    from hil.rpc.codec import Encoded

Request = tuple[int, str, list["Encoded"]]


def request(question: Question) -> tuple[Session, Request] | None:
    """The agent request that answers ``question``, or None for one this module does not ask ahead."""
    target, name, args = question
    if isinstance(target, RemoteSocket) and name in ("connected", "closed") and not args:
        return target.session, (target.oid, "state", [])
    if isinstance(target, RemoteProvider) and name == "registrations" and len(args) == 1:
        return target.session, (target.oid, "registrations", [target.session.codec.encode(args[0])])
    if isinstance(target, RemoteBuffer) and name == "read" and not args:
        process = target.process
        return process.session, (process.oid, "buffer_read", [target.address, target.length, target.length, 0])
    if isinstance(target, RemoteProcess) and name == "alive" and not args:
        return target.session, (target.oid, "alive", [])
    if isinstance(target, RemoteProxy) and name == "live_allocations" and not args:
        return target.session, (target.oid, "live_allocations", [])
    if isinstance(target, RemoteOperation) and name == "done" and not args and target.pending:
        return target.session, (target.oid, "wait", [0])
    return None


@contextlib.contextmanager
def answering(questions: Sequence[Question]) -> Iterator[None]:
    """Ask ``questions`` (those ``request`` knows) of every agent at once, one round trip in all; the
    stand-ins answer them as found then, until the block ends."""
    asked: dict[int, tuple[Session, list[tuple[object, Request]]]] = {}
    for question in questions:
        found = request(question)
        if found is not None:
            session, req = found
            asked.setdefault(id(session), (session, []))[1].append((question[0], req))
    sent: list[tuple[Session, list[tuple[object, Request]]]] = []
    try:
        with contextlib.suppress(Exception):  # an agent that fails is asked again, and fails, in its place
            for session, reqs in asked.values():
                session.send_many([req for _, req in reqs])
                sent.append((session, reqs))
        for session, reqs in sent:  # every request written is read, or its agent is dead
            with contextlib.suppress(Exception):
                _keep(session, reqs, session.collect())
        yield
    finally:
        for session, _ in asked.values():
            session.answered.clear()


def _keep(session: Session, reqs: list[tuple[object, Request]], outcomes: list[Outcome]) -> None:
    for (target, (oid, method, args)), (ok, value) in zip(reqs, outcomes, strict=True):
        if isinstance(target, RemoteOperation):
            if target.waited((ok, value)):
                session.answered[oid, "done", question_key([])] = (True, False)
        else:
            session.answered[oid, method, question_key(args)] = (ok, value)
