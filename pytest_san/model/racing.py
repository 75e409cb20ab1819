"""Asking a backend whether it ended an operation on its own: the engine's half of a documented race.

What may end, when, and how the model then moves on is the race's, beside its alternative
(alternatives.py, ``Race``); here is only how the backend is asked: every operation old enough, together.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..batch import batch, wait_for
from .alternatives import Race
from .handles import Handles
from .reference import Model
from .state import Expect

Waiting = list[tuple[Race, int, int]]
"""(race, socket, op) of each operation old enough to have ended on its own."""


def old(races: list[Race], model: Model, handles: Handles) -> Waiting:
    """The operations each race lists as waiting, once they are old enough to ask about."""
    now = time.monotonic()
    return [(race, sock, op) for race in races for sock, op in race.waiting(model)
            if op in handles.ops and now - handles.posted.get(op, now) > race.after]


def gave_up(handles: Handles, waiting: Waiting) -> set[int]:
    """Which of the ``waiting`` operations ended on their own (one look at each, together)."""
    with batch(handles.world.backend) as b:
        looks = [(race, op, b.call(wait_for, handles.ops[op], 0)) for race, _, op in waiting]
    return {op for race, op, look in looks if look.error is None and race.gave_up(look.value)}


def ended(races: list[Race], model: Model, handles: Handles) -> Iterator[Expect]:
    """The model moved on past each operation that ended on its own, one by one: what it expects of each."""
    if not races:
        return
    waiting = old(races, model, handles)
    done = gave_up(handles, waiting)
    for race, sock, op in waiting:
        if op in done:
            yield race.ended(model, sock)
