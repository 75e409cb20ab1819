"""Calls made together: on a backend with ``Pipelining`` (hil) in one round trip per host, else one by one.

The switch builds each end of a connection this way (two allocations, two registrations, its receives),
and the reference model runs its steps, their completions and its checks this way, so that a real lab pays
a few round trips for them instead of one per call. A call may name what an earlier call of the same list
returned, as an argument or as its target (:class:`Earlier`), and may read a property (a name that is not a
method, with no arguments).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from contextlib import AbstractContextManager

from .protocols import Answering, Call, Outcome, Pipelining, Question


@dataclasses.dataclass(frozen=True)
class Earlier:
    """In a list of calls made together: what call ``index`` (an earlier one) returned. A call that names an
    earlier call that failed is not made: its outcome is the same failure."""

    index: int


class _Failed(Exception):
    """An earlier call named by this one failed (internal: the outcome carries that call's exception)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def resolve(value: object, outcomes: Sequence[Outcome]) -> object:
    """``value`` with every :class:`Earlier` in it (in lists and tuples too) replaced by what that call returned."""
    if isinstance(value, Earlier):
        if not 0 <= value.index < len(outcomes):
            raise ValueError(f"Earlier({value.index}) names no earlier call")
        ok, result = outcomes[value.index]
        if not ok:
            raise _Failed(result if isinstance(result, Exception) else RuntimeError(repr(result)))
        return result
    if not named(value):
        return value  # the very object: a call made together gets what it would get alone
    if type(value) is list:
        return [resolve(v, outcomes) for v in value]
    assert type(value) is tuple
    return tuple(resolve(v, outcomes) for v in value)


def named(value: object) -> set[int]:
    """The indices of the earlier calls that ``value`` names (in lists and tuples too)."""
    if isinstance(value, Earlier):
        return {value.index}
    found: set[int] = set()
    if type(value) is list or type(value) is tuple:
        for item in value:
            found |= named(item)
    return found


def make(target: object, name: str, args: Sequence[object]) -> object:
    """``target.name(*args)``; a property (not callable) is read, and takes no arguments."""
    attribute = getattr(target, name)
    if callable(attribute):
        return attribute(*args)
    if args:
        raise TypeError(f"{name} of {target!r:.80} is not a method: it takes no arguments")
    return attribute


def one_by_one(calls: Sequence[Call]) -> list[Outcome]:
    """Each call made in turn, its outcome kept (a failure does not stop the ones after it, except those that
    name it)."""
    outcomes: list[Outcome] = []
    for target, method, args in calls:
        try:
            made = make(resolve(target, outcomes), method, [resolve(a, outcomes) for a in args])
            outcomes.append((True, made))
        except _Failed as failed:
            outcomes.append((False, failed.exc))
        except Exception as exc:  # the caller decides what a failure means
            outcomes.append((False, exc))
    return outcomes


def together(backend: object, calls: Sequence[Call]) -> list[Outcome]:
    """The outcome of each call, made together where ``backend`` can (``Pipelining``)."""
    if isinstance(backend, Pipelining):
        return backend.together(calls)
    return one_by_one(calls)


def asking(backend: object, questions: Sequence[Question]) -> AbstractContextManager[None]:
    """Within the block, ``questions`` answered as found when it began, asked together where ``backend`` can
    (``Answering``: on a lab one round trip for all hosts); elsewhere asked as usual."""
    if isinstance(backend, Answering) and questions:
        return backend.answering(questions)
    return contextlib.nullcontext()


def first_failure(outcomes: Sequence[Outcome]) -> Exception | None:
    return next((value for ok, value in outcomes if not ok and isinstance(value, Exception)), None)
