"""A batch's calls made together (``pytest_san.batch``): each agent's calls written at once, in order, and every
agent's replies read in one round trip.

A call goes so when it is a declared remote method of a stand-in (hil/controller/declared.py: ``WAYS``, collected
from the classes) or one of ``pytest_san.batch``'s functions on a stand-in (``READS``: a property's read, a call
on an earlier call's operation). Its body is run to capture what it asks; the replies read, it is run again with
them as its answers, which makes its outcome what the direct call gives. A body that asks again (``@remote_waves``,
``connect_sockets``) asks in the next wave.

A call may name what an earlier call returned (``Later.ref``, a ``pytest_san.batch.Ref`` until the batch is made):
on the same host, in the same wave, it goes as ``{"$r": request id}`` in the same write, the agent resolving it (a
register's handle in the transfer after it, the transfer's operation in a wait); on another host it waits for
that reply, one more round trip (a *wave*: a host's calls never overtake each other); a call behind a barrier
(``Batch.barrier``) waits so for every call before it. A batch holding a call on anything else (a provider
wrapped by a plugin, a function of the test's) is made one call at a time, as in-process: that wrapper sees
each call as it would alone.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from hil.controller.client import Outcome
from hil.controller.declared import WAYS, Request, asks_once, body_of
from hil.controller.declared import run as run_body
from hil.controller.remote import Remote, RemoteBuffer, Session
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

READS: frozenset[Callable[..., Any]] = frozenset({is_alive, is_closed, is_connected, is_done, wait_for})
"""``pytest_san.batch``'s functions whose first argument is a stand-in: each reads a declared property or calls a
declared method of it, so it goes as that does."""

_NOT_ANSWERED: Outcome = (False, RuntimeError("not answered"))


@dataclasses.dataclass
class _Run:
    """One call of the batch as it is made: its body and arguments (the target first), the answers its asks got,
    and, while a wave is written, the request it sends in it."""

    body: Callable[..., Any]
    args: tuple[object, ...]
    after: int
    answers: list[tuple[Request, Outcome]] = dataclasses.field(default_factory=list)
    outcome: Outcome | None = None
    request: Request | None = None  # sent in this wave
    rid: int | None = None
    placeheld: int | None = None  # the call whose operation stands in as the target (of the same write)
    names: frozenset[int] = frozenset()  # the calls its arguments name (``Ref``), target included


def _run_of(call: Call) -> _Run | None:
    """How ``call`` is made together; None when it cannot be."""
    if call.kwargs:
        return None
    if inspect.ismethod(call.fn):
        body = body_of(call.fn)
        if body is None:
            return None
        if body not in WAYS:  # declared, but on a class nobody collected: a bug, not a call to make one by one
            raise TypeError(f"{body.__qualname__} is declared remote on a class that is not @declared")
        return _Run(body, (call.fn.__self__, *call.args), call.after, names=frozenset(named(list(call.args))))
    if call.fn in READS and call.args and isinstance(call.args[0], (Remote, RemoteBuffer, Ref)):
        return _Run(call.fn, tuple(call.args), call.after, names=frozenset(named(list(call.args))))
    return None


def make_together(calls: Sequence[Call]) -> list[Outcome]:
    made = Together.of(calls)
    if made is None:
        return made_one_by_one(calls)
    made.make()
    return [run.outcome or _NOT_ANSWERED for run in made.runs]


class Together:
    """Calls being made together: ``make()``, then each one's outcome and the wave it first asked in."""

    @classmethod
    def of(cls, calls: Sequence[Call]) -> Together | None:
        """The calls to make together; None when one of them cannot be."""
        runs = [_run_of(call) for call in calls]
        if not all(runs) or any(max(run.names, default=-1) >= index
                                for index, run in enumerate(cast(list[_Run], runs))):
            return None  # one by one, a call naming no earlier call fails as it does in-process
        return cls(cast(list[_Run], runs))

    def __init__(self, runs: list[_Run]) -> None:
        self.runs = runs
        self.waves: list[int | None] = [None] * len(runs)  # the wave each call first asked in (for tests)

    def make(self) -> None:
        wave = 0
        while any(run.outcome is None for run in self.runs):
            self._plan(wave)
            self._send_and_read()
            wave += 1

    # -- a wave's requests

    def _plan(self, wave: int) -> None:
        """Each call's request in this wave, if it can go; a call that cannot go yet blocks its host's later calls
        (or every later call, when its host is not known yet)."""
        blocked: set[int] = set()
        everything_blocked = False
        for index, run in enumerate(self.runs):
            if run.outcome is not None or run.request is not None:  # made, or asking again (_send_and_read)
                continue
            failed = self._failed(run)
            if failed is not None:  # it names a call that failed: not made, the same failure
                run.outcome = failed
                continue
            args = self._arguments(run)
            if args is None:
                everything_blocked = True
                continue
            outcome, request = run_body(run.body, args, run.answers)
            if request is None:  # answered without asking (a kept completion, a bad argument): as its host's calls
                session = _session_of(args[0])
                if self._ordered(run, session):
                    run.outcome = outcome
                    continue
            else:
                session = request.session
                if not everything_blocked and id(session) not in blocked and self._ordered(run, session):
                    self.waves[index] = wave
                    run.request = request
                    continue
            run.placeheld = None  # not in this wave
            if session is None:
                everything_blocked = True
            else:
                blocked.add(id(session))
        if not any(run.request is not None for run in self.runs) and any(run.outcome is None for run in self.runs):
            raise RuntimeError("calls made together stopped: none of them could be made")  # a bug of this module

    def _ask(self, run: _Run) -> None:
        """``run``'s body again, with the answers it has: its outcome, or its next request."""
        args = cast(tuple[object, ...], resolve(run.args, self._outcomes())) if run.names else run.args
        outcome, request = run_body(run.body, args, run.answers)
        if request is None:
            run.outcome = outcome
        elif asks_once(run.body):
            run.outcome = (False, RuntimeError(f"{run.body.__qualname__} asked twice: declare it @remote_waves"))
        else:
            run.request = request

    def _arguments(self, run: _Run) -> tuple[object, ...] | None:
        """``run``'s arguments with what each call it names returned (a call of this write that names the result
        of another as a reference the agent resolves stays a ``Ref``); None when its target is not known yet."""
        if not run.names:
            return run.args
        target, *rest = run.args
        if isinstance(target, Ref):
            source = self.runs[target.index]
            if source.outcome is not None:
                target = source.outcome[1]
            else:
                standing = _placeholder(source)
                if standing is None:
                    return None
                run.placeheld = target.index
                target = standing
        return (target, *(self._resolved(arg) for arg in rest))

    def _resolved(self, value: object) -> object:
        """``value`` with each ``Ref`` to a call made already replaced by its result."""
        if isinstance(value, Ref):
            outcome = self.runs[value.index].outcome
            return value if outcome is None else outcome[1]
        if named(value) and (type(value) is list or type(value) is tuple):
            items = [self._resolved(v) for v in cast("list[object] | tuple[object, ...]", value)]
            return items if type(value) is list else tuple(items)
        return value

    def _ordered(self, run: _Run, session: Session | None) -> bool:
        """Whether every call ``run`` names or follows (behind a barrier) is made, or is written before it in this
        wave to ``session`` and asks nothing after."""
        for source in map(self.runs.__getitem__, (*run.names, *range(run.after))):
            if source.outcome is not None:
                continue
            if source.request is None or source.request.session is not session or not asks_once(source.body):
                return False
        return True

    def _failed(self, run: _Run) -> Outcome | None:
        """The outcome of the first call ``run`` names that failed, or None."""
        for index in sorted(run.names):
            outcome = self.runs[index].outcome
            if outcome is not None and not outcome[0]:
                return outcome
        return None

    # -- writing and reading

    def _send_and_read(self) -> None:
        """Send this wave's requests (each agent's at once, in order), then read every agent's replies and run
        each body again with its reply; an agent that fails raises AgentError once the others' are read."""
        sessions: dict[int, tuple[Session, list[_Run]]] = {}
        for run in self.runs:
            if run.request is not None:
                sessions.setdefault(id(run.request.session), (run.request.session, []))[1].append(run)
        failure: Exception | None = None
        sent: list[tuple[Session, list[_Run]]] = []
        for session, runs in sessions.values():
            try:
                for run in runs:
                    run.rid = session.send_one(*self._encode(session, run))
                sent.append((session, runs))
            except Exception as exc:
                failure = failure or exc
        replies: dict[int, Outcome] = {}
        for session, runs in sent:
            deadlines = [run.request.deadline for run in runs if run.request and run.request.deadline is not None]
            try:
                outcomes = session.collect(max(deadlines, default=0) or None)
            except Exception as exc:
                failure = failure or exc
                continue
            for run, reply in zip(runs, outcomes, strict=True):
                assert run.request is not None
                session.heard(run.request, reply)
                replies[id(run)] = reply
        for run in self.runs:  # each body again, in the order of the calls
            request = run.request
            if request is None:
                continue
            run.request = run.rid = None
            heard = replies.get(id(run))
            failed = self._failed(run)
            if failed is not None:  # it named a call of this write that failed: the same failure, as alone
                run.outcome = failed
            elif heard is None:
                run.outcome = _NOT_ANSWERED
            else:
                run.answers.append((request, heard))
                run.placeheld = None
                self._ask(run)
        if failure is not None:
            raise failure

    def _outcomes(self) -> list[Outcome | None]:
        return [run.outcome for run in self.runs]

    def _encode(self, session: Session, run: _Run) -> tuple[Encoded, str, list[Encoded]]:
        """The request on the wire: a ``Ref`` to a call of this write as ``{"$r": id}``."""

        def encode(value: object) -> Encoded:
            if not named(value):
                return session.codec.encode(value)
            if isinstance(value, Ref):
                return {"$r": self.runs[value.index].rid}
            return [encode(v) for v in cast("list[object] | tuple[object, ...]", value)]  # named: a list or tuple

        request = run.request
        assert request is not None
        if not run.names:  # most calls: nothing of this write to name
            return request.oid, request.method, [session.codec.encode(a) for a in request.args]
        wire: Encoded = request.oid if run.placeheld is None else {"$r": self.runs[run.placeheld].rid}
        return wire, request.method, [encode(a) for a in request.args]


def _placeholder(source: _Run) -> Remote | None:
    """What stands for ``source``'s result as a later call's target in the same write: a fresh stand-in of the
    type its body returns, when ``source`` asks in this wave and that type is an object of its agent."""
    if source.request is None or not asks_once(source.body):
        return None
    kind = _returns(source.body)
    if kind is None:
        return None
    try:
        return kind(source.request.session, -1)
    except TypeError:  # a stand-in made with more than its session and id (a socket, a process)
        return None


_RETURNS: dict[Callable[..., Any], type[Remote] | None] = {}


def _returns(body: Callable[..., Any]) -> type[Remote] | None:
    """The stand-in type ``body`` returns, read from its annotation (once per body)."""
    if body not in _RETURNS:
        annotation = inspect.get_annotations(body).get("return")
        kind = eval(annotation, body.__globals__) if isinstance(annotation, str) else annotation
        _RETURNS[body] = kind if isinstance(kind, type) and issubclass(kind, Remote) else None
    return _RETURNS[body]


def _session_of(target: object) -> Session | None:
    session = getattr(target, "session", None)
    return session if isinstance(session, Session) else None
