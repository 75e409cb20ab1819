"""Calls made together: the one way the switch, the scenarios and the model make several calls at once, so that a
lab pays one round trip per host for them instead of one per call::

    with batch(backend) as b:
        buf = b.call(process.alloc, 4096)                                       # Later[Buffer]
        handle = b.call(provider.register_memory, socket, buf.ref, Access.READ)  # Later[Handle]
        op = b.call(provider.recv, socket, [(buf.ref, handle.ref)])
        done = b.call(is_done, op.ref)
    handle.value  # the handle, or the exception register_memory raised

A call is a bound method of a backend's object (or one of this module's functions, for a property's read or a
call on what an earlier call returned) and its arguments, checked by mypy as a direct call is. ``later.ref`` stands
for what an earlier call returned, as an argument of a later call of the same batch: a call that names a failed
one is not made, and its outcome is that same failure. Each call's outcome is read once the block has ended:
``later.value`` (raising the call's exception) or ``later.error``.

An in-process backend makes each call when it is added. A backend with ``Batching`` (hil) makes them when the
block ends: each host's calls in one write, hosts at once, a host's calls in the order given (a call naming one of
another host's waits for it: one more round trip). ``b.barrier()`` makes every later call wait so for every earlier
one: the model's step is its call, the waits for what it completes, a barrier, then the reads that judge it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, NamedTuple, ParamSpec, Protocol, TypeGuard, TypeVar, cast, runtime_checkable

from .spi.contract import Completion
from .spi.protocols import PendingOperation, Process, Socket

__all__ = ["Answered", "Batch", "Batching", "Call", "Later", "Outcome", "batch", "done_ahead", "first_error",
           "is_alive", "is_closed", "is_connected", "is_done", "made_one_by_one", "named", "raise_first", "values",
           "wait_for"]

#: A call's parameters.
P = ParamSpec("P")
#: What a call returns.
R = TypeVar("R")
#: What a ``Later`` holds.
T_co = TypeVar("T_co", covariant=True)

Outcome = tuple[bool, Any]
"""(True, what a call returned) or (False, the exception it raised)."""


# -- reads and calls that travel: properties, and calls on what an earlier call returned

def is_done(op: PendingOperation) -> bool:
    """``op.done()``: as a function, so that ``b.call(is_done, later.ref)`` may name an earlier call's operation."""
    return op.done()


def wait_for(op: PendingOperation, timeout: float | None, after: object = None) -> Completion:
    """``op.wait(timeout)``, as a function for the same reason as ``is_done``. ``after``: an earlier call's
    ``Later.ref`` this wait depends on, though it waits for another operation: when that call failed, this one
    is not made (a receive's completion is not waited for when the send that would complete it was refused)."""
    return op.wait(timeout)


def is_closed(socket: Socket) -> bool:
    """``socket.closed``: a property's read as a call a batch can make."""
    return socket.closed


def is_connected(socket: Socket) -> bool:
    """``socket.connected``."""
    return socket.connected


def is_alive(process: Process) -> bool:
    """``process.alive``."""
    return process.alive


# -- the batch

class Call(NamedTuple):
    """A call of a batch: ``fn(*args, **kwargs)``, where an argument may be an earlier call's ``Later.ref``; it
    follows the first ``after`` calls of the batch, whatever their hosts (``Batch.barrier``)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    after: int = 0


@dataclasses.dataclass(frozen=True, eq=False)
class Ref:
    """What ``Later.ref`` gives while its call's outcome is unknown or failed: it names call ``index``."""

    index: int


class _Unmade(Exception):
    """A call named a failed one (internal: carries that call's exception)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc


class Later(Generic[T_co]):
    """What a call of a batch returns, once the batch has been made."""

    __slots__ = ("_index", "_owner")

    def __init__(self, owner: Batch, index: int) -> None:
        self._owner = owner
        self._index = index

    @property
    def ref(self) -> T_co:
        """This call's result as an argument of a later call of the same batch."""
        outcome = self._owner.outcomes[self._index]
        if outcome is not None and outcome[0]:
            return cast(T_co, outcome[1])
        return cast(T_co, Ref(self._index))  # stands for the result until the batch is made

    @property
    def value(self) -> T_co:
        """What the call returned; the exception it raised is raised here."""
        ok, value = self.outcome
        if not ok:
            raise value
        return cast(T_co, value)

    @property
    def error(self) -> Exception | None:
        """The exception the call raised, or None."""
        ok, value = self.outcome
        return None if ok else cast(Exception, value)

    @property
    def outcome(self) -> Outcome:
        """(True, what the call returned) or (False, the exception it raised)."""
        if not self._owner.made:
            raise RuntimeError("a batch's results are read once its block has ended")
        outcome = self._owner.outcomes[self._index]
        assert outcome is not None  # made: every call has its outcome
        return outcome


@runtime_checkable
class Batching(Protocol):
    """Optional, for a backend whose every call is a round trip (hil): ``make_together(calls)`` makes each call as
    if alone, those on one host in the order given (hosts at once), and returns each one's outcome. A call may
    name an earlier one (``Ref``: a call naming a failed one fails the same, unmade)."""

    def make_together(self, calls: Sequence[Call]) -> list[Outcome]: ...


class Batch:
    """Calls added with ``call`` and made together (see the module's docstring); a context manager."""

    def __init__(self, backend: object) -> None:
        self._maker = backend if _batches(backend) else None
        self.calls: list[Call] = []
        self.outcomes: list[Outcome | None] = []
        self.made = False
        self._after = 0  # the calls before the last barrier

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Later[R]:
        """``fn(*args, **kwargs)`` in this batch (an argument may be an earlier call's ``Later.ref``): what it
        returns, once the batch is made."""
        if self.made:
            raise RuntimeError("this batch was made already: start another")
        made = Call(fn, args, kwargs, self._after)
        self.calls.append(made)
        self.outcomes.append(None if self._maker is not None else _make(made, self.outcomes))
        return Later(self, len(self.calls) - 1)

    def barrier(self) -> None:
        """Every call added from now on is made after every call added before, whatever their hosts: reads that
        must see what earlier calls on another host did (an RDMA write waited for on one host, the bytes it wrote
        read on the other). In-process calls are made in turn anyway; on a lab a host whose calls follow another
        host's waits for them, one more round trip."""
        self._after = len(self.calls)

    def make(self) -> None:
        """Make what is not made yet (``__exit__`` does, unless the block raised)."""
        if self.made:
            return
        self.made = True
        if self._maker is not None and self.calls:
            self.outcomes = list(self._maker.make_together(self.calls))

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.make()


def _batches(backend: object) -> TypeGuard[Batching]:
    return isinstance(backend, Batching)


def batch(backend: object) -> Batch:
    """A batch of calls on ``backend``'s objects (see the module's docstring)."""
    return Batch(backend)


class Answered(dict[int, bool]):
    """Whether each operation asked ahead is done, by ``id``; it holds the operations themselves too, so that none
    of them is freed and its ``id`` taken by a new operation while the answers are in use."""

    def __init__(self, answers: Iterable[tuple[PendingOperation, bool]]) -> None:
        kept = list(answers)
        super().__init__((id(op), done) for op, done in kept)
        self.ops = [op for op, _ in kept]


def done_ahead(backend: object, ops: Iterable[PendingOperation]) -> Answered:
    """Whether each of ``ops`` is done, asked together (on a lab one round trip): what a switch's progress
    passes down so that it asks no operation twice. One whose answer failed is left out (asked again where it
    is looked at, so its failure is raised there)."""
    with batch(backend) as b:
        asked = [(op, b.call(op.done)) for op in ops]
    return Answered((op, bool(done.value)) for op, done in asked if done.error is None)


def first_error(laters: Iterable[Later[Any]]) -> Exception | None:
    """The first of ``laters`` that failed: its exception."""
    for later in laters:
        error = later.error
        if error is not None:
            return error
    return None


def raise_first(laters: Iterable[Later[Any]]) -> None:
    """The first failure of ``laters``, raised."""
    failure = first_error(laters)
    if failure is not None:
        raise failure


def values(laters: Sequence[Later[R]]) -> list[R]:
    """What each call returned; the first failure is raised."""
    raise_first(laters)
    return [later.value for later in laters]


# -- making calls one by one (in-process, and hil's way for calls it cannot send together)

def named(value: object) -> set[int]:
    """The indices of the earlier calls that ``value`` names (in lists and tuples too)."""
    if isinstance(value, Ref):
        return {value.index}
    found: set[int] = set()
    if type(value) is list or type(value) is tuple:
        for item in value:
            found |= named(item)
    return found


def resolve(value: object, outcomes: Sequence[Outcome | None]) -> object:
    """``value`` with every ``Ref`` in it (in lists and tuples too) replaced by what that call returned."""
    if isinstance(value, Ref):
        if not 0 <= value.index < len(outcomes):
            raise ValueError(f"call {value.index} is no earlier call of this batch")
        outcome = outcomes[value.index]
        if outcome is None:
            raise RuntimeError(f"call {value.index} of this batch is not made yet")
        ok, result = outcome
        if not ok:
            raise _Unmade(result)
        return result
    if not named(value):
        return value  # the very object: a call made together gets what it would get alone
    if type(value) is list:
        return [resolve(v, outcomes) for v in value]
    if type(value) is tuple:
        return tuple(resolve(v, outcomes) for v in value)
    return value  # unreached: only a Ref, a list or a tuple names a call


_NESTED = (Ref, list, tuple)
"""The types of an argument that may name an earlier call."""


def _make(call: Call, outcomes: Sequence[Outcome | None]) -> Outcome:
    try:
        if not any(type(a) in _NESTED for a in call.args) and not call.kwargs:  # most calls: nothing to resolve
            return True, call.fn(*call.args)
        args = [resolve(a, outcomes) for a in call.args]
        kwargs = {k: resolve(v, outcomes) for k, v in call.kwargs.items()}
        return True, call.fn(*args, **kwargs)
    except _Unmade as unmade:
        return False, unmade.exc
    except Exception as exc:  # the caller decides what a failure means
        return False, exc


def made_one_by_one(calls: Sequence[Call]) -> list[Outcome]:
    """Each call made in turn, its outcome kept (a failure does not stop the ones after it, except those that
    name it)."""
    outcomes: list[Outcome] = []
    for call in calls:
        outcomes.append(_make(call, outcomes))
    return outcomes
