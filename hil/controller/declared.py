"""Remote methods, each declared once, where its stand-in defines it.

``@remote`` marks a stand-in's method (or a property's getter) whose body asks its agent (``Session.call``) and
turns the reply into what it returns. That one body is the direct call and, in ``hil/controller/together.py``,
the batched form: run under a ``Script``, the ask past the answers it was given is captured as a request to send
together with other calls (``Asked``), and once the replies are read the body runs again with them as its
answers. ``@remote_waves`` marks a body that asks more than once (``connect_sockets``: listen, then connect):
one wave each.

So the code before an ask runs again on every wave: it checks arguments, finds stand-ins or tells a peer once,
nothing that must not happen twice. ``@remote_void`` marks a call whose answer nobody reads: while the end of a
test collects such calls in its batch (``Session.deferred``), it joins that batch instead of being made.
``@local`` marks a public method that asks nothing. ``@declared`` checks at import that every public method of a
stand-in is one of these (none is left without a batched form) and collects its remote methods in ``WAYS``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from hil.controller.client import Outcome
    from hil.controller.remote import Session
    from pytest_san.batch import Batch

P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])

REMOTE = "__san_remote__"
"""The attribute ``@remote`` sets on a function: its body (for ``@remote_void``, the body it wraps)."""
LOCAL = "__san_local__"
WAVES = "__san_waves__"


def remote(fn: F) -> F:
    """A method (or property getter) whose body asks its agent once: see the module's docstring."""
    setattr(fn, REMOTE, fn)
    return fn


def remote_waves(fn: F) -> F:
    """``@remote`` for a body that asks more than once, each ask after the reply to the one before: in a batch,
    one wave each (no call of the same write may name what it returns)."""
    setattr(fn, WAVES, True)
    return remote(fn)


def asks_once(body: Callable[..., Any]) -> bool:
    return not getattr(body, WAVES, False)


class Deferring(Protocol):
    """What ``@remote_void`` needs of its stand-in: the session, which may be collecting calls in a batch."""

    @property
    def deferred(self) -> Batch | None: ...


class HasSession(Protocol):
    @property
    def session(self) -> Deferring: ...


S = TypeVar("S", bound=HasSession)


def remote_void(fn: Callable[Concatenate[S, P], None]) -> Callable[Concatenate[S, P], None]:
    """``@remote`` for a call whose answer nobody reads: while its session defers (the end of a test), it joins
    that batch instead (its error is the batch's outcome), else it is made at once."""

    @functools.wraps(fn)
    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> None:
        batch = self.session.deferred
        if batch is None:
            fn(self, *args, **kwargs)
        else:
            batch.call(getattr(self, fn.__name__), *args, **kwargs)

    setattr(call, REMOTE, fn)
    return call


def local(fn: F) -> F:
    """A public method that asks the agent nothing (a check, a view, what the stand-in keeps)."""
    setattr(fn, LOCAL, True)
    return fn


def body_of(fn: object) -> Callable[..., Any] | None:
    """The body of a declared remote method, of a bound one, or of a property whose getter is declared; None
    for anything else."""
    if isinstance(fn, property):
        fn = fn.fget
    fn = getattr(fn, "__func__", fn)
    body = getattr(fn, REMOTE, None)
    return body if callable(body) else None


C = TypeVar("C", bound=type)

WAYS: dict[Callable[..., Any], type] = {}
"""Every declared remote method's body, and the class that declares it: what goes together, collected from the
classes (``declared``, ``collected``) as they are made."""


def collected(cls: C) -> C:
    """``cls``'s declared remote methods, in ``WAYS``."""
    for member in vars(cls).values():
        body = body_of(member)
        if body is not None:
            WAYS[body] = cls
    return cls


def declared(cls: C) -> C:
    """A stand-in, collected once every public method and property of it (its own, and what it inherits) is
    declared ``@remote``, ``@remote_waves``, ``@remote_void`` or ``@local``; else a TypeError, at import."""
    missing = []
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        getter = member.fget if isinstance(member, property) else member
        if body_of(member) is None and not getattr(getter, LOCAL, False):
            missing.append(name)
    if missing:
        raise TypeError(f"{cls.__name__}: {', '.join(missing)} not declared @remote, @remote_void or @local "
                        "(hil/controller/declared.py): every method of a stand-in has a batched form")
    return collected(cls)


@dataclasses.dataclass(frozen=True)
class Request:
    """One ask of a declared body: the session it goes to, the agent object (its id, or a placeholder's), the
    method, its arguments (not yet encoded; a ``pytest_san.batch.Ref`` may stand for an earlier call's result)
    and how long its reply may take."""

    session: Session
    oid: int
    method: str
    args: tuple[object, ...]
    deadline: float | None = None


class Asked(BaseException):
    """An ask past the answers a body was given: its request, to send (a BaseException, so that no ``except
    Exception`` in a body takes it for a failure)."""

    def __init__(self, request: Request) -> None:
        super().__init__(request.method)
        self.request = request


class Script:
    """The answers a body gets on this run, in order: a reply for each ask, then a capture."""

    def __init__(self, answers: list[tuple[Request, Outcome]]) -> None:
        self.answers = answers
        self.asked = 0

    def ask(self, request: Request) -> Any:
        if self.asked == len(self.answers):
            raise Asked(request)
        earlier, (ok, value) = self.answers[self.asked]
        self.asked += 1
        if earlier.method != request.method:  # the body's path changed between waves: a bug of the stand-in
            raise RuntimeError(f"a declared body asked {request.method} where it asked {earlier.method} before")
        if not ok:
            raise value
        return value


SCRIPT: ContextVar[Script | None] = ContextVar("SCRIPT", default=None)
"""The script of the body being made together, if any (``Session.call`` asks it instead of the agent)."""


def run(body: Callable[..., Any], args: tuple[object, ...], answers: list[tuple[Request, Outcome]]
        ) -> tuple[Outcome | None, Request | None]:
    """``body(*args)`` with ``answers``: (its outcome, None) when it returned or raised, or (None, its next
    request) when it asked past them."""
    token = SCRIPT.set(Script(answers))
    try:
        return (True, body(*args)), None
    except Asked as asked:
        return None, asked.request
    except Exception as exc:  # the call's own failure, as alone
        return (False, exc), None
    finally:
        SCRIPT.reset(token)
