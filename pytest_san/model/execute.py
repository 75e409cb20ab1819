"""The engine: one backend running a sequence, each step made through the public API and judged.

As hypothesis's stateful testing keeps rules and invariants apart from the loop that runs them, a step's
parts each live in one place: the model's transition (reference.py), what each type of step calls and
answers (kinds.py, the one dispatch on a step's type), the checks of the answer and of the state after it
(invariants.py), and what a backend may do on its own between the steps (its alternative's race,
alternatives.py). ``Side`` is the loop that makes them meet: the step's call, its waits and the reads its
checks compare in one batch (a lab: one round trip per host), then the judgement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping
from typing import cast

from ..batch import Later, batch
from ..spi.contract import Completion, SanError
from ..spi.protocols import PendingOperation
from . import invariants, racing
from .alternatives import races
from .handles import Handles, Looked
from .invariants import Problem
from .kinds import answered, kind_of
from .reference import Model
from .state import Expect, Touched, Traits
from .steps import Step
from .world import World

__all__ = ["Cost", "Problem", "Seen", "Side"]


@dataclasses.dataclass
class Seen:
    """What one backend answered to one step, and what was wrong with it."""

    expect: Expect
    call: str = ""  # skipped | handle | descriptor | operation | done | a WSA code's name | an exception
    done: dict[int, str] = dataclasses.field(default_factory=dict)  # op id -> its completion
    problems: list[Problem] = dataclasses.field(default_factory=list)
    # ops that completed by the backend's own choice (a send that gave up waiting), not by the step: the
    # other backend of a differential run may not take that alternative, so they are not compared
    aside: set[int] = dataclasses.field(default_factory=set)

    def problem(self, category: str, message: str) -> None:
        self.problems.append(Problem(category, message))

    def answer(self) -> tuple[str, tuple[tuple[int, str], ...]]:
        """What two backends' answers are compared by (differential mode)."""
        return self.call, tuple(sorted((op, done) for op, done in self.done.items() if op not in self.aside))


@dataclasses.dataclass
class Cost:
    """Seconds spent, to print the cost per step and per sequence."""

    setup: float = 0.0  # connecting, rewriting buffers
    calls: float = 0.0
    checks: float = 0.0
    finish: float = 0.0  # closing, the final checks
    steps: int = 0

    @contextlib.contextmanager
    def spent(self, on: str) -> Iterator[None]:
        """Add the seconds the block takes to field ``on`` (not when it raises: a crash has no cost line)."""
        t0 = time.perf_counter()
        yield
        setattr(self, on, getattr(self, on) + time.perf_counter() - t0)


def _merged(seen: Seen, other: Seen | None) -> Seen:
    """``seen`` with what ``other`` saw added (a send that gave up before the step, reported with it)."""
    if other is not None:
        seen.expect.alternatives |= other.expect.alternatives
        seen.done.update(other.done)
        seen.aside |= other.aside | set(other.done)
        seen.problems += other.problems
    return seen


def _outcome(step: Step, result: object) -> str:
    if isinstance(result, SanError):
        return result.code.name
    if isinstance(result, BaseException):
        return f"{type(result).__name__}: {result}"
    return answered(step)


class Side:
    """``world``'s backend running sequences, expected to have ``traits`` (``desc_size`` is probed as a sequence
    starts); ``full``: check everything after every step (where calls are cheap)."""

    def __init__(self, name: str, world: World, traits: Traits, *, full: bool, timeout: float = 30.0) -> None:
        self.name, self.world, self.traits, self.full, self.timeout = name, world, traits, full, timeout
        self.model: Model | None = None
        self.handles = Handles(world)
        self.races = races(traits.alts)
        self.cost = Cost()

    @property
    def _model(self) -> Model:
        assert self.model is not None, "start() makes the sequence's model"
        return self.model

    def start(self) -> Model:
        """Connect the sequence's sockets (every slot's at once), rewrite the buffers; a fresh model."""
        with self.cost.spent("setup"):
            self.handles.connect_all()
            desc_size = self.world.probe(self.handles.socks[0])
            self.world.fresh_bytes()
            self.world.forget_bytes()  # known again when the sequence ends as the model says
            self.model = Model(self.world.plan, dataclasses.replace(self.traits, desc_size=desc_size))
        return self.model

    def run(self, step: Step) -> Seen:
        """One step: the model's expectation, the step made as one batch, its answer and the state judged."""
        model, on, kind = self._model, self.handles, kind_of(step)
        with self.cost.spent("checks"):
            gave_up = self.catch_up()
        # An operation may end on its own between that look and the call: then the step is judged again (below).
        racy = model.snapshot() if racing.old(self.races, model, on) else None
        direct = kind.direct(on, model, step) if kind.direct is not None else None  # before the model moves on
        seen = _merged(Seen(model.apply(step)), gave_up)
        if seen.expect.skip:
            seen.call = "skipped"
            return seen
        with self.cost.spent("calls"):
            checked = invariants.compared(model, seen.expect, full=self.full, nodes=len(self.world.nodes),
                                          known=on.known_after(step))
            made = on.make(step, model, seen.expect, checked, 0 if seen.problems else self.timeout, direct)
            self._judge(step, seen, made.result, made.waits)
            if seen.problems and racy is not None and racing.gave_up(on, racing.old(self.races, racy, on)):
                on.ops.update(on.popped)  # their completions are kept: waiting again answers the same
                model.restore(racy)  # in place: the generator holds this model
                seen = _merged(Seen(model.apply(step)), _merged(self.catch_up() or Seen(Expect()), gave_up))
                self._judge(step, seen, made.result)
        with self.cost.spent("checks"):
            self._settled_check(seen, made.looked)
        self.cost.steps += 1
        return seen

    def catch_up(self) -> Seen | None:
        """What the backend ended on its own, as its alternatives' races allow, with the model moved on past it."""
        seen = None
        for expect in racing.ended(self.races, self._model, self.handles):
            gave_up = Seen(expect)
            self._completions(gave_up)
            seen = _merged(seen or Seen(Expect()), gave_up)
        return seen

    def _judge(self, step: Step, seen: Seen, result: object,
               waits: Mapping[int, Later[Completion]] | None = None) -> None:
        """``result``: what the call returned or raised; then the completions the model expects."""
        exp, model, kind = seen.expect, self._model, kind_of(step)
        seen.call = _outcome(step, result)
        model.answered(exp, result)  # a refusal the step allowed instead: the model goes back, exp expects it
        problem = invariants.answer(exp, seen.call, result)
        if problem is None and not exp.raises:
            problem, op = kind.took(model, step, result), kind.op(step)
            if op is not None:  # waiting for it judges it
                self.handles.posted_op(op, cast(PendingOperation, result))
        seen.problems += [problem] if problem is not None else []
        self._completions(seen, waits)

    def _completions(self, seen: Seen, waits: Mapping[int, Later[Completion]] | None = None) -> None:
        """Each completion the model expects, as ``waits`` (the step's batch) saw it, else waited for now; once the
        step went wrong, what has not completed is only reported, not waited for."""
        for op_id, expected in seen.expect.done.items():
            done = self.handles.completion(op_id, waits, 0 if seen.problems else self.timeout)
            if done is not None:  # else its call did not return an operation: a problem already
                seen.done[op_id], problem = invariants.completion(op_id, expected, done)
                seen.problems += [problem] if problem is not None else []

    def _settled_check(self, seen: Seen, looked: Looked | None = None) -> None:
        """The checks, on what the step's batch ``looked`` at if it covers them (else, or if those differ from the
        model, on reads of their own); if they fail while an operation ended on its own, again once the model knows."""
        before = len(seen.problems)
        self.check(seen, looked)
        if looked is not None and len(seen.problems) > before:
            # rxe posts an error completion before it moves the QP to ERR: reads sent with the wait that saw it may
            # be older than that. Reads of their own, a round trip later as before issue 29, decide.
            del seen.problems[before:]
            self.check(seen)
        if len(seen.problems) > before and self.races and racing.gave_up(
                self.handles, racing.old(self.races, self._model, self.handles)):
            del seen.problems[before:]
            _merged(seen, self.catch_up())
            self.check(seen)

    def check(self, seen: Seen, looked: Looked | None = None) -> None:
        """Compare the backend's state with the model's, every read of it made together, or read already
        (``looked``: by the step's batch, used when it covers what the model, having judged the answer, checks)."""
        checked = invariants.compared(self._model, seen.expect, full=self.full, nodes=len(self.world.nodes),
                                      known=set(self.handles.ops))
        if looked is not None and invariants.covers(looked[0], checked):
            looks = looked[1]
        else:
            with batch(self.world.backend) as b:
                looks = self.handles.reads(b, checked)
        seen.problems += invariants.state(self._model, checked, lambda key: looks[key].value, full=self.full,
                                          baseline=self.world.baseline, address=self.world.address)

    def finish(self) -> Seen:
        """Check everything, close every open socket, check that nothing is left (R11)."""
        model, world = self._model, self.world
        with self.cost.spent("finish"):
            seen = self.catch_up() or Seen(Expect())
            if not self.full and not seen.problems:  # what no step looked at: open sockets' registrations, states
                opened = {s.id for s in model.open_sockets()}
                seen.expect.touched = Touched(registrations=opened, states=opened, nodes=set(range(len(world.nodes))))
                self._settled_check(seen)
            closes = model.close_all()
            # Remote: backend.leaks() lists every registration and proxy allocation left, so no proxy is asked.
            last = Touched(buffers=set(model.data), nodes=set(range(len(world.nodes))) if self.full else set())
            checked = invariants.compared(model, Expect(touched=last), full=self.full, nodes=len(world.nodes),
                                          known=set(self.handles.ops))
            with batch(world.backend) as b:  # the closes, then (behind a barrier) what the last check reads
                closing = self.handles.closes(b, closes, self.timeout)
                b.barrier()
                looks = self.handles.reads(b, checked)
            for sock_id, exp, closed, waits in closing:  # each close judged: what it raised, then its completions
                judged = Seen(exp, problems=[Problem("call", f"close_socket(s{sock_id}) raised {closed.error!r}")]
                              if closed.error is not None else [])
                self._completions(judged, waits if closed.error is None else None)
                seen.problems += judged.problems
            if not seen.problems:
                seen.expect.touched = last
                self.check(seen, (checked, looks))
                seen.problems += invariants.leaks(world.backend.leaks())
            if not seen.problems:
                world.data = {key: bytes(value) for key, value in model.data.items()}
        return seen

    def abandon(self) -> bool:
        """After a divergence: close whatever is open. False: something is left (reset the backend)."""
        return self.handles.abandon()
