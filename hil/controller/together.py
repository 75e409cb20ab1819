"""A batch's calls made together (``pytest_san.batch``): each agent's calls written at once, in order, and every
agent's replies read in one round trip; each reply becomes what the stand-in's own method returns.

Which calls go so is ``WAYS``, keyed by the stand-ins' own methods (and ``pytest_san.batch``'s functions for a
property's read or a call on an earlier call's operation). A call may name what an earlier call returned
(``Later.ref``, a ``pytest_san.batch.Ref`` until the batch is made): on the same host it goes as
``{"$r": request id}`` in the same write, the agent resolving it (a register's handle in the transfer after
it, the transfer's operation in a wait); on another host it waits for that reply, one more round trip (a
*wave*: a host's calls never overtake each other); a call behind a barrier (``Batch.barrier``) waits so for
every call before it. A call this module does not send so (another method, a
provider wrapped by a plugin) makes the whole list go one call at a time, as in-process.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

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
from pytest_san.batch import (
    Call,
    Ref,
    is_alive,
    is_closed,
    is_connected,
    is_done,
    made_one_by_one,
    named,
    resolve,
    wait_for,
)

if TYPE_CHECKING:
    from hil.rpc.codec import Encoded

Args = tuple[object, ...]


@dataclasses.dataclass(frozen=True)
class Request:
    """What a stand-in's call sends: the agent object (the stand-in, or a Ref to an earlier call's), the agent's
    method and its arguments (not yet encoded), and how long its reply may take; or, when the stand-in knows
    the answer already (a completion it keeps, a bad offset), that outcome, nothing sent."""

    obj: object = None
    method: str = ""
    args: Args = ()
    deadline: float | None = None
    known: Outcome | None = None


@dataclasses.dataclass(frozen=True)
class Way:
    """How one stand-in method goes together: the stand-in type it is called on, its request (from the target
    stand-in, or a ``Ref`` of the same write, and the arguments), how the reply becomes the method's outcome
    (given the session, the target stand-in, the arguments and the reply's outcome), and the stand-in type it
    returns (what a later call may name as its target)."""

    target: type
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


def _completion(target: RemoteOperation | Ref, args: Args) -> Request:
    timeout = args[0] if args else 10.0
    if isinstance(target, RemoteOperation) and not target.pending:
        return Request(known=(True, target.wait(0)))
    limit = timeout + 30 if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
        and 0 <= timeout < 1e9 else None
    return Request(target, "wait", (timeout,), deadline=limit)


def _completed(session: Session, target: RemoteOperation, args: Args, outcome: Outcome) -> Outcome:
    ok, value = outcome
    return (True, target.completed(value)) if ok else outcome


def _done(target: RemoteOperation | Ref, args: Args) -> Request:
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


_OPERATION: dict[str, Callable[..., Any]] = {
    "rdma_write": RemoteProvider.rdma_write, "rdma_read": RemoteProvider.rdma_read,
    "send": RemoteProvider.send, "recv": RemoteProvider.recv}

WAYS: dict[Callable[..., Any], Way] = {
    RemoteProcess.alloc: Way(RemoteProcess, _method("alloc"), _value(lambda s, v: s.buffer(v)), RemoteBuffer),
    is_alive: Way(RemoteProcess, _method("alive"), _value(lambda s, v: bool(v))),
    RemoteBuffer.read: Way(RemoteBuffer, _buffer("buffer_read", RemoteBuffer.checked_read), _plain),
    RemoteBuffer.write: Way(RemoteBuffer, _buffer("buffer_write", RemoteBuffer.checked_write), _plain),
    RemoteProvider.register_memory: Way(RemoteProvider, _method("register_memory"),
                                        _value(lambda s, v: as_handle(v))),
    RemoteProvider.register_rdma_memory: Way(RemoteProvider, _method("register_rdma_memory"),
                                             _value(lambda s, v: bytes(v))),
    RemoteProvider.deregister_memory: Way(RemoteProvider, _method("deregister_memory"), _plain),
    RemoteProvider.deregister_rdma_memory: Way(RemoteProvider, _method("deregister_rdma_memory"), _plain),
    RemoteProvider.close_socket: Way(RemoteProvider, _method("close_socket"), _closed),
    RemoteProvider.getsockopt: Way(RemoteProvider, _method("getsockopt"), _value(lambda s, v: int(v))),
    RemoteProvider.registrations: Way(RemoteProvider, _method("registrations"),
                                      _value(lambda s, v: as_registrations(v))),
    **{fn: Way(RemoteProvider, _method(name), _value(_operation), RemoteOperation) for name, fn in _OPERATION.items()},
    RemoteProxy.live_allocations: Way(RemoteProxy, _method("live_allocations"), _value(lambda s, v: int(v))),
    RemoteProxy.allocate: Way(RemoteProxy, _method("allocate"), _value(lambda s, v: s.obj(v, RemoteAllocation)),
                              RemoteAllocation),
    RemoteProxy.free: Way(RemoteProxy, _method("free"), _plain),
    is_connected: Way(RemoteSocket, _method("state"), _state(0)),
    is_closed: Way(RemoteSocket, _method("state"), _state(1)),
    RemoteOperation.done: Way(RemoteOperation, _done, _waited),
    is_done: Way(RemoteOperation, _done, _waited),
    RemoteOperation.wait: Way(RemoteOperation, _completion, _completed),
    wait_for: Way(RemoteOperation, _completion, _completed),
}
"""The calls that go together: the stand-ins' methods, and ``pytest_san.batch``'s functions (their first
argument the target). Only an operation may be the target of a call naming an earlier one (what a transfer
returned, waited for in the same write)."""


def _parts(call: Call) -> tuple[object, Way, Args] | None:
    """The call's target, way and remaining arguments; None when it cannot go together."""
    if call.kwargs:
        return None
    if inspect.ismethod(call.fn):
        target, way, args = call.fn.__self__, WAYS.get(call.fn.__func__), call.args
    elif call.args:
        target, way, args = call.args[0], WAYS.get(call.fn), call.args[1:]
    else:
        return None
    return None if way is None else (target, way, args)


@dataclasses.dataclass
class _Planned:
    session: Session
    way: Way
    target: object  # the stand-in, or Ref(i): what call i returns
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
    for call in calls:
        parts = _parts(call)
        if parts is None:
            return None
        target, way, args = parts
        session: Session | None
        if isinstance(target, Ref):
            if not 0 <= target.index < len(planned):
                return None
            source = planned[target.index]
            if source.way.returns is not way.target:
                return None
            session = source.session
        elif isinstance(target, way.target):
            session = _session_of(target)
        else:
            return None
        if session is None:
            return None
        wave = max((p.wave for p in planned if p.session is session), default=0)
        for earlier in planned[:call.after]:  # behind a barrier: after every call before it
            wave = max(wave, earlier.wave + (earlier.session is not session))
        for index in named(list(args)) | named(target):
            if not 0 <= index < len(planned):
                return None
            earlier = planned[index]
            wave = max(wave, earlier.wave + (earlier.session is not session))
        planned.append(_Planned(session, way, target, tuple(args), wave))
    return planned


def make_together(calls: Sequence[Call]) -> list[Outcome]:
    planned = _plan(calls)
    if planned is None:
        return made_one_by_one(calls)
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
        failed = _failed_earlier(call, outcomes)
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
            failed = _failed_earlier(call, outcomes)
            if failed is not None:  # it named a call of this write that failed: the same failure, as alone
                outcomes[index] = failed
            elif request.known is not None:
                outcomes[index] = request.known  # answered by the stand-in: final
            else:
                assert reply is not None
                outcomes[index] = call.way.convert(session, _resolved(call.target, outcomes), call.args, reply)
    if failure is not None:
        raise failure


def _failed_earlier(call: _Planned, outcomes: list[Outcome | None]) -> Outcome | None:
    """The outcome of the first call ``call`` names that failed, or None."""
    for index in sorted(named(list(call.args)) | named(call.target)):
        outcome = outcomes[index]
        if outcome is not None and not outcome[0]:
            return outcome
    return None


def _this_wave(value: object, call: _Planned, planned: list[_Planned]) -> bool:
    return isinstance(value, Ref) and planned[value.index].wave == call.wave


def _resolved(value: object, outcomes: list[Outcome | None]) -> object:
    return resolve(value, [o or (False, RuntimeError("not answered")) for o in outcomes])


def _encode(session: Session, request: Request, planned: list[_Planned],
            outcomes: list[Outcome | None]) -> tuple[Encoded, str, list[Encoded]]:
    """The request on the wire: a Ref to a call of this write as ``{"$r": id}``, of an earlier wave as its result."""

    def encode(value: object) -> Encoded:
        if not named(value):
            return session.codec.encode(value)
        if isinstance(value, Ref):
            source = planned[value.index]
            if outcomes[value.index] is None and source.rid is not None:
                return {"$r": source.rid}
            return session.codec.encode(_resolved(value, outcomes))
        return [encode(v) for v in cast("list[object] | tuple[object, ...]", value)]  # named: a list or tuple

    obj = request.obj
    if isinstance(obj, Ref):
        wire: Encoded = encode(obj)
    else:
        assert hasattr(obj, "oid")
        wire = obj.oid
    return wire, request.method, [encode(a) for a in request.args]
