"""Calls made together (pytest_san.protocols.Pipelining): each agent's calls written at once, in order, and
every agent's replies read in one round trip; each reply becomes what the stand-in's own method returns.

A call may name what an earlier call returned (``pytest_san.together.Earlier``): on the same host it goes as
``{"$r": request id}`` in the same write, the agent resolving it (a register's handle in the transfer after
it, the transfer's operation in a wait); on another host it waits for that reply, one more round trip (a
*wave*: a host's calls never overtake each other). A call this module does not send so (another method, a
provider wrapped by a plugin) makes the whole list go one call at a time, as in-process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hil.controller.client import Outcome
from hil.controller.remote import (
    RemoteAllocation,
    RemoteBuffer,
    RemoteOperation,
    RemoteProcess,
    RemoteProvider,
    RemoteProxy,
    RemoteSocket,
    Session,
    as_handle,
    as_registrations,
)
from pytest_san.protocols import Call
from pytest_san.together import Earlier, named, one_by_one, resolve

if TYPE_CHECKING:
    from hil.rpc.codec import Encoded

Args = tuple[object, ...]


@dataclasses.dataclass(frozen=True)
class Request:
    """What a stand-in's call sends: the agent object (the stand-in, or an earlier call's result), the agent's
    method and its arguments (not yet encoded), and how long its reply may take; or, when the stand-in knows
    the answer already (a completion it keeps, a bad offset), that outcome, nothing sent."""

    obj: object = None
    method: str = ""
    args: Args = ()
    deadline: float | None = None
    known: Outcome | None = None


@dataclasses.dataclass(frozen=True)
class Way:
    """How one stand-in method goes together: its request (from the target stand-in, or an ``Earlier`` of the
    same write, and the arguments), how the reply becomes the method's outcome (given the session, the target
    stand-in, the arguments and the reply's outcome), and the stand-in type it returns (what a later call may
    name as its target)."""

    request: Callable[[Any, Args], Request]
    convert: Callable[[Session, Any, Args, Outcome], Outcome]
    returns: type | None = None


def _plain(session: Session, target: object, args: Args, outcome: Outcome) -> Outcome:
    return outcome


def _value(read: Callable[[Session, Any], object]) -> Callable[[Session, Any, Args, Outcome], Outcome]:
    def convert(session: Session, target: object, args: Args, outcome: Outcome) -> Outcome:
        ok, value = outcome
        return (True, read(session, value)) if ok else outcome
    return convert


def _closed(session: Session, target: RemoteProvider, args: Args, outcome: Outcome) -> Outcome:
    if args and isinstance(args[0], RemoteSocket):
        target.closed_socket(args[0])  # the relay to the peer's host, as the stand-in's own close makes it
    return outcome


def _method(name: str) -> Callable[[Any, Args], Request]:
    return lambda target, args: Request(target, name, args)


def _completion(target: RemoteOperation | Earlier, args: Args) -> Request:
    timeout = args[0] if args else 10.0
    if isinstance(target, RemoteOperation) and not target.pending:
        return Request(known=(True, target.wait(0)))
    limit = timeout + 30 if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
        and 0 <= timeout < 1e9 else None
    return Request(target, "wait", (timeout,), deadline=limit)


def _completed(session: Session, target: RemoteOperation, args: Args, outcome: Outcome) -> Outcome:
    ok, value = outcome
    return (True, target.completed(value)) if ok else outcome


def _done(target: RemoteOperation | Earlier, args: Args) -> Request:
    if isinstance(target, RemoteOperation) and not target.pending:
        return Request(known=(True, True))
    return Request(target, "wait", (0,))


def _waited(session: Session, target: RemoteOperation, args: Args, outcome: Outcome) -> Outcome:
    return (True, not target.waited(outcome))


def _buffer(method: str, checked: Callable[..., tuple[object, int]]) -> Callable[[RemoteBuffer, Args], Request]:
    """A buffer's read or write: checked by the stand-in (a bad offset is its error, nothing sent), then asked
    of its process with the whole buffer, as the stand-in's own method asks."""

    def request(target: RemoteBuffer, args: Args) -> Request:
        try:
            first, offset = checked(target, *args)
        except (TypeError, ValueError) as exc:
            return Request(known=(False, exc))
        return Request(target.process, method, (target.address, target.length, first, offset))

    return request


def _state(index: int) -> Callable[[Session, Any, Args, Outcome], Outcome]:
    def convert(session: Session, target: object, args: Args, outcome: Outcome) -> Outcome:
        ok, value = outcome
        return (True, bool(value[index])) if ok else outcome
    return convert


def _operation(session: Session, value: Any) -> object:
    return session.obj(value, RemoteOperation)


WAYS: dict[tuple[type, str], Way] = {
    (RemoteProcess, "alloc"): Way(_method("alloc"), _value(lambda s, v: s.buffer(v)), RemoteBuffer),
    (RemoteProcess, "alive"): Way(_method("alive"), _value(lambda s, v: bool(v))),
    (RemoteBuffer, "read"): Way(_buffer("buffer_read", RemoteBuffer.checked_read), _plain),
    (RemoteBuffer, "write"): Way(_buffer("buffer_write", RemoteBuffer.checked_write), _plain),
    (RemoteProvider, "register_memory"): Way(_method("register_memory"), _value(lambda s, v: as_handle(v))),
    (RemoteProvider, "register_rdma_memory"): Way(_method("register_rdma_memory"), _value(lambda s, v: bytes(v))),
    (RemoteProvider, "deregister_memory"): Way(_method("deregister_memory"), _plain),
    (RemoteProvider, "deregister_rdma_memory"): Way(_method("deregister_rdma_memory"), _plain),
    (RemoteProvider, "close_socket"): Way(_method("close_socket"), _closed),
    (RemoteProvider, "getsockopt"): Way(_method("getsockopt"), _value(lambda s, v: int(v))),
    (RemoteProvider, "registrations"): Way(_method("registrations"), _value(lambda s, v: as_registrations(v))),
    **{(RemoteProvider, name): Way(_method(name), _value(_operation), RemoteOperation)
       for name in ("rdma_write", "rdma_read", "send", "recv")},
    (RemoteProxy, "live_allocations"): Way(_method("live_allocations"), _value(lambda s, v: int(v))),
    (RemoteProxy, "allocate"): Way(_method("allocate"), _value(lambda s, v: s.obj(v, RemoteAllocation)),
                                   RemoteAllocation),
    (RemoteProxy, "free"): Way(_method("free"), _plain),
    (RemoteSocket, "connected"): Way(_method("state"), _state(0)),
    (RemoteSocket, "closed"): Way(_method("state"), _state(1)),
    (RemoteOperation, "done"): Way(_done, _waited),
    (RemoteOperation, "wait"): Way(_completion, _completed),
}
"""The stand-in methods (and properties) that go together, by (stand-in type, name). Only an operation may be
the target of a call naming an earlier one (what a transfer returned, waited for in the same write)."""


@dataclasses.dataclass
class _Planned:
    session: Session
    way: Way
    target: object  # the stand-in, or Earlier(i): what call i returns
    args: Args
    wave: int = 0
    rid: int | None = None


def _session_of(target: object) -> Session | None:
    if isinstance(target, RemoteBuffer):
        return target.process.session
    session = getattr(target, "session", None)
    return session if isinstance(session, Session) else None


def _plan(calls: Sequence[Call]) -> list[_Planned] | None:
    """Each call's session, way and wave; None when one of them cannot go together."""
    planned: list[_Planned] = []
    for target, method, args in calls:
        kind: type | None
        session: Session | None
        if isinstance(target, Earlier):
            if not 0 <= target.index < len(planned):
                return None
            source = planned[target.index]
            kind, session = source.way.returns, source.session
            if kind is not RemoteOperation:
                return None
        else:
            kind, session = type(target), _session_of(target)
        way = WAYS.get((kind, method)) if kind is not None else None
        if way is None or session is None:
            return None
        wave = max((p.wave for p in planned if p.session is session), default=0)
        for index in named(list(args)) | named(target):
            if not 0 <= index < len(planned):
                return None
            earlier = planned[index]
            wave = max(wave, earlier.wave + (earlier.session is not session))
        planned.append(_Planned(session, way, target, tuple(args), wave))
    return planned


def together(calls: Sequence[Call]) -> list[Outcome]:
    planned = _plan(calls)
    if planned is None:
        return one_by_one(calls)
    outcomes: list[Outcome | None] = [None] * len(calls)
    for wave in range(max((p.wave for p in planned), default=-1) + 1):
        _wave([i for i, p in enumerate(planned) if p.wave == wave], planned, outcomes)
    return [outcome or (False, RuntimeError("not answered")) for outcome in outcomes]


def _wave(indices: list[int], planned: list[_Planned], outcomes: list[Outcome | None]) -> None:
    """Send this wave's calls (each agent's at once), then read every agent's replies; an agent that fails
    raises AgentError once the others' replies are read."""
    sessions: dict[int, tuple[Session, list[tuple[int, Request]]]] = {}
    for index in indices:
        call = planned[index]
        failed = next((outcomes[i] for i in sorted(named(list(call.args)) | named(call.target))
                       if outcomes[i] is not None and not outcomes[i][0]), None)  # type: ignore[index]
        if failed is not None:  # it names a call that failed: not made, the same failure
            outcomes[index] = failed
            continue
        target = call.target if _this_wave(call.target, call, planned) else _resolved(call.target, outcomes)
        sessions.setdefault(id(call.session), (call.session, []))[1].append((index, call.way.request(target,
                                                                                                    call.args)))
    sent: list[tuple[Session, list[tuple[int, Request]]]] = []
    failure: Exception | None = None
    for session, requests in sessions.values():
        try:
            for index, request in requests:
                if request.known is None:
                    planned[index].rid = session.send_one(*_encode(session, request, planned, outcomes))
            sent.append((session, requests))
        except Exception as exc:
            failure = failure or exc
    for session, requests in sent:
        deadlines = [r.deadline for _, r in requests if r.deadline is not None]
        try:
            replies = iter(session.collect(max(deadlines, default=0) or None))
        except Exception as exc:
            failure = failure or exc
            continue
        for index, request in requests:
            call = planned[index]
            reply = None if request.known is not None else next(replies)
            failed = next((outcomes[i] for i in sorted(named(list(call.args)) | named(call.target))
                           if outcomes[i] is not None and not outcomes[i][0]), None)  # type: ignore[index]
            if failed is not None:  # it named a call of this write that failed: the same failure, as alone
                outcomes[index] = failed
            elif request.known is not None:
                outcomes[index] = request.known  # answered by the stand-in: final
            else:
                assert reply is not None
                outcomes[index] = call.way.convert(session, _resolved(call.target, outcomes), call.args, reply)
    if failure is not None:
        raise failure


def _this_wave(value: object, call: _Planned, planned: list[_Planned]) -> bool:
    return isinstance(value, Earlier) and planned[value.index].wave == call.wave


def _resolved(value: object, outcomes: list[Outcome | None]) -> object:
    return resolve(value, [o or (False, RuntimeError("not answered")) for o in outcomes])


def _encode(session: Session, request: Request, planned: list[_Planned],
            outcomes: list[Outcome | None]) -> tuple[Encoded, str, list[Encoded]]:
    """The request on the wire: an Earlier of this write as ``{"$r": id}``, of an earlier wave as its result."""

    def encode(value: object) -> Encoded:
        if not named(value):
            return session.codec.encode(value)
        if isinstance(value, Earlier):
            source = planned[value.index]
            if outcomes[value.index] is None and source.rid is not None:
                return {"$r": source.rid}
            return session.codec.encode(_resolved(value, outcomes))
        return [encode(v) for v in value]  # type: ignore[attr-defined]

    obj = request.obj
    if isinstance(obj, Earlier):
        wire: Encoded = encode(obj)
    else:
        assert hasattr(obj, "oid")
        wire = obj.oid
    return wire, request.method, [encode(a) for a in request.args]
