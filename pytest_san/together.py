"""Calls made together: on a backend with ``Pipelining`` (hil) in one round trip per host, else one by one.

The switch builds each end of a connection this way (two allocations, two registrations, its receives),
so that a real lab pays a few round trips for it instead of one per call."""

from __future__ import annotations

from collections.abc import Sequence

from .protocols import Call, Outcome, Pipelining


def one_by_one(calls: Sequence[Call]) -> list[Outcome]:
    """Each call made in turn, its outcome kept (a failure does not stop the ones after it)."""
    outcomes: list[Outcome] = []
    for target, method, args in calls:
        try:
            outcomes.append((True, getattr(target, method)(*args)))
        except Exception as exc:  # the caller decides what a failure means
            outcomes.append((False, exc))
    return outcomes


def together(backend: object, calls: Sequence[Call]) -> list[Outcome]:
    """The outcome of each call, made together where ``backend`` can (``Pipelining``)."""
    if isinstance(backend, Pipelining):
        return backend.together(calls)
    return one_by_one(calls)


def first_failure(outcomes: Sequence[Outcome]) -> Exception | None:
    return next((value for ok, value in outcomes if not ok and isinstance(value, Exception)), None)
