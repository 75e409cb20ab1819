"""A model run: seeded sequences within a budget, divergences shrunk, the cost measured.

Sequence ``k`` of seed ``S`` draws every choice from ``random.Random(f"{S}/{k}")`` and starts from
fresh sockets and the same buffer bytes, so ``--san-model-seed S`` replays a run. In differential
mode every step also runs on a fresh in-process emulator with the same processes and connections,
and where the model expects the same of both, their answers must be the same too: for a call with
several faults only where both declare ``reference_order`` (else the model accepts any of their codes
of the backend, and the sides' expectations differ).
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Generator as Stream

from ..report import ModelResult
from ..spi.checks import REFERENCE_ORDER
from ..spi.protocols import Backend, ModelBudget, budget_of
from .alternatives import active
from .divergence import Divergence, listing, step_kind
from .execute import Cost, Problem, Seen, Side
from .generate import Generator
from .reference import Model
from .regressions import REGRESSIONS, Regression
from .rules import ANSWERS, broken_rules
from .shrink import shrink
from .state import Traits
from .steps import Plan, Step
from .world import ProbeRefused, World

MAX_DIVERGENCES = 5  # distinct ones: then the run stops (each costs a shrink)
DIFFERENTIAL_REPLAYS = 60  # a differential replay runs on both backends: at most this many for a shrink


@dataclasses.dataclass
class Summary:
    backend: str
    seed: int
    differential: bool
    sequences: int = 0
    steps: int = 0
    regressions: int = 0  # sequences of regressions.py replayed first
    seconds: float = 0.0
    shrinking: float = 0.0  # of ``seconds``: replaying divergences to shrink them
    replaying: float = 0.0  # of ``seconds``: replaying the regressions, once a run before its sequences
    divergences: list[Divergence] = dataclasses.field(default_factory=list)
    cost: Cost = dataclasses.field(default_factory=Cost)
    alternatives: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def result(self) -> ModelResult:
        """This run as the report's ``"model"`` holds it (the divergences rendered for it, the cost a line)."""
        return ModelResult(self.backend, sequences=self.sequences, steps=self.steps,
                           divergences=[d.to_dict() for d in self.divergences], seeds=[self.seed],
                           differential=self.differential, seconds=self.seconds,
                           costs=[f"{self.backend}: {self.cost_line()}"],
                           alternatives=dict(sorted(self.alternatives.items())), regressions=self.regressions)

    def cost_line(self) -> str:
        c, n, k = self.cost, max(self.steps, 1), max(self.sequences, 1)
        running = self.seconds - self.shrinking - self.replaying
        aside = [f"{self.replaying:.1f} s replaying {self.regressions} regressions first"] if self.regressions else []
        aside += [f"{self.shrinking:.1f} s shrinking"] if self.shrinking else []
        shrunk = f" (and {', '.join(aside)})" if aside else ""
        return (f"{self.sequences} sequences, {self.steps} steps in {running:.1f} s{shrunk}: "
                f"{running / k:.2f} s a sequence (connecting {c.setup / k:.2f} s, closing and final checks "
                f"{c.finish / k:.2f} s), {1000 * (c.calls + c.checks) / n:.1f} ms a step "
                f"(calls {1000 * c.calls / n:.1f} ms, checks {1000 * c.checks / n:.1f} ms)")


Outcome = tuple[int | None, str, Problem]  # (step index or None for the end, side, problem)


class ModelRun:
    """Model-check ``backend`` (``pytest_san.model``'s test calls ``run``)."""

    def __init__(self, backend: Backend, budget: ModelBudget, *, plan: Plan | None = None,
                 reference: Callable[[int], Backend] | None = None, log: Callable[[str], None] = print,
                 capabilities: Mapping[str, frozenset[str]] | None = None) -> None:
        """``plan``: which nodes the processes live on (default: as many of the backend's nodes as it has, up to
        three); ``reference``: builds the differential mode's backend from a node count (default: the emulator);
        ``capabilities``: node name -> what it can do (default: the backend's, for every node), as the plugin
        reads them from the provider under test."""
        self.backend = backend
        self.budget = budget
        self.log = log
        self.seed = budget.seed if budget.seed is not None else random.SystemRandom().getrandbits(32)
        self.world = World(backend, plan)
        caps = [frozenset(capabilities[n.name]) if capabilities is not None else frozenset(backend.capabilities)
                for n in self.world.nodes]
        common = frozenset.intersection(*caps)
        self.traits = Traits(alts=active(common), sends_wait="send_waits" in common,
                             no_read=frozenset(i for i, c in enumerate(caps) if "rdma_read" not in c),
                             reference_order=REFERENCE_ORDER in common)
        self.reference = reference
        if budget.differential and reference is None:
            from ..spi.emulator import EmulatorBackend  # the in-process emulator, unwrapped
            self.reference = EmulatorBackend
        reference_name = "emulator" if backend.name != "emulator" else "reference emulator"  # told apart
        self.names = [backend.name] + ([reference_name] if budget.differential else [])
        self.summary = Summary(backend.name, self.seed, budget.differential)
        self.under_test: Side | None = None  # the backend's side of the last sequence or replay started

    def _sides(self) -> list[Side]:
        budget = self.budget
        sides = [Side(self.names[0], self.world, self.traits, full=budget.full_checks, timeout=budget.call_timeout)]
        if self.reference is not None:
            ref = World(self.reference(len(self.world.nodes)), self.world.plan)
            traits = Traits(sends_wait=self.traits.sends_wait,
                            reference_order=REFERENCE_ORDER in ref.backend.capabilities)
            own = budget_of(ref.backend)  # the reference's own checks and waits
            sides.append(Side(self.names[1], ref, traits, full=own.full_checks, timeout=own.call_timeout))
        return sides

    def run(self) -> Summary:
        t0 = time.monotonic()
        until = None if self.budget.deadline is None else t0 + self.budget.deadline
        summary = self.summary
        for regression in REGRESSIONS:
            self._regression(regression)
        summary.replaying = time.monotonic() - t0
        for k in range(self.budget.sequences):
            if until is not None and time.monotonic() > until:
                self.log(f"san model: deadline reached after {k} sequences")
                break
            self._sequence(k, until)
            summary.sequences += 1
            if len(summary.divergences) >= MAX_DIVERGENCES:
                self.log(f"san model: {MAX_DIVERGENCES} distinct divergences: stopping")
                break
        summary.seconds = time.monotonic() - t0
        return summary

    # -- one sequence ----------------------------------------------------------------------------

    def _start(self, sides: Sequence[Side]) -> Outcome | None:
        """Start each side's sequence; a provider that fails the descriptor-size probe is a divergence."""
        for side in sides:
            try:
                side.start()
            except ProbeRefused as exc:
                self._cleanup(sides)
                return None, side.name, Problem("probe", str(exc))
        self.under_test = sides[0]
        return None

    def _sequence(self, k: int, until: float | None) -> None:
        sides = self._sides()
        refused = self._start(sides)
        if refused is not None:
            self._diverged(k, [], [], refused, until)
            return
        model = sides[0].model
        assert model is not None
        gen = Generator(model, random.Random(f"{self.seed}/{k}"), slow=self.budget.avoid_slow_steps)

        def draw(state: Model) -> Step:
            gen.model = state  # the model as the next step finds it (a round's: ahead of the judged one)
            return gen.next()

        steps: list[Step] = []
        seen: list[list[Seen]] = []
        outcome: Outcome | None = None
        made = self._made(sides, draw, self.budget.steps)
        for i, (step, first) in enumerate(made):
            steps.append(step)
            outcome = self._judge_step(sides, step, i, first, seen, alternatives=self.summary.alternatives)
            self.summary.steps += 1
            if outcome is not None:
                break
        made.close()
        if outcome is None:
            outcome = self._finish(sides)
        self.summary.cost = _add(self.summary.cost, sides[0].cost)
        if outcome is None:
            return
        self._cleanup(sides)
        self._diverged(k, steps, seen, outcome, until)

    def _made(self, sides: Sequence[Side], draw: Callable[[Model], Step | None],
              count: int) -> Stream[tuple[Step, Seen], None, None]:
        """Each step drawn (up to ``count``) and what the backend under test made of it, one by one."""
        side = sides[0]
        for _ in range(count):
            assert side.model is not None
            step = draw(side.model)
            if step is None:
                return
            yield step, side.run(step)

    def _judge_step(self, sides: Sequence[Side], step: Step, index: int, first: Seen,
                 seens: list[list[Seen]] | None = None,
                 alternatives: collections.Counter[str] | None = None) -> Outcome | None:
        """Judge one step: what the backend under test made of it (``first``) and the reference's run of it, each
        held to the model, then their answers compared; the first problem or difference, else None."""
        seen = [first, *(side.run(step) for side in sides[1:])]
        if seens is not None:
            seens.append(seen)
        if alternatives is not None:  # the documented alternatives the backend was expected to take
            alternatives.update(seen[0].expect.alternatives)
        for side, answer in zip(sides, seen, strict=True):
            if answer.problems:
                return index, side.name, answer.problems[0]
        if len(seen) == 2 and seen[0].expect.summary() == seen[1].expect.summary():
            a, b = seen[0].answer(), seen[1].answer()
            if a != b:
                return index, "both", Problem("differ", f"{sides[0].name} answered {_show(a)}, "
                                                        f"{sides[1].name} answered {_show(b)}")
        return None

    def _finish(self, sides: Sequence[Side]) -> Outcome | None:
        for side in sides:
            seen = side.finish()
            if seen.problems:
                return None, side.name, seen.problems[0]
        return None

    def _cleanup(self, sides: Sequence[Side]) -> None:
        """After a divergence: close everything; if anything is left, reset the backend, new processes."""
        if not sides[0].abandon():
            self.log("san model: the backend kept something after a divergence: resetting it")
            self.backend.reset()
            self.world = World(self.backend, self.world.plan)
        self.world.forget_bytes()

    # -- a divergence ----------------------------------------------------------------------------

    def _replay(self, steps: Sequence[Step], seens: list[list[Seen]] | None = None) -> Outcome | None:
        sides = self._sides()
        refused = self._start(sides)
        if refused is not None:
            return refused
        given = iter(steps)
        made = self._made(sides, lambda _: next(given, None), len(steps))
        for i, (step, first) in enumerate(made):
            outcome = self._judge_step(sides, step, i, first, seens)
            if outcome is not None:
                made.close()
                self._cleanup(sides)
                return outcome
        outcome = self._finish(sides)
        if outcome is not None:
            self._cleanup(sides)
        return outcome

    def _regression(self, regression: Regression) -> None:
        seens: list[list[Seen]] = []
        outcome = self._replay(regression.steps, seens)
        self.summary.regressions += 1
        if outcome is None:
            return
        if outcome[2].category == "probe" and any(d.problem.category == "probe" for d in self.summary.divergences):
            return  # every regression starts with the probe: one divergence says it
        index, side, problem = outcome
        steps = list(regression.steps)
        div = Divergence("regression", self.seed, -1, side, problem,
                         step_kind(steps[index] if index is not None else None), steps, name=regression.name,
                         index=index, rules=self._rules(steps, index, problem))
        div.lines = listing(self.world.plan, steps, seens, self.names, index, problem)
        self.summary.divergences.append(div)
        self.log(div.render())

    def _rules(self, steps: Sequence[Step], index: int | None, problem: Problem) -> tuple[str, ...]:
        """The rules the divergence breaks (rules.py), judged with the keys the backend returned last."""
        model = self.under_test.model if self.under_test is not None else None
        keys = dict(model.keys) if model is not None else {}
        traits = model.traits if model is not None else self.traits

        def fresh() -> Model:
            made = Model(self.world.plan, traits)
            made.refused_at_call = dict(model.refused_at_call) if model is not None else {}  # as the backend did
            return made

        try:
            return broken_rules(problem, steps, index, fresh, keys)
        except Exception as exc:  # the divergence still counts, under the rule of wrong answers
            self.log(f"san model: could not tell which rule the divergence breaks ({exc!r}): {ANSWERS}")
            return (ANSWERS,)

    def _signature(self, steps: Sequence[Step], outcome: Outcome) -> tuple[str, str, str, tuple[str, ...]]:
        """What makes two divergences the same: the side, what was wrong after what kind of step, and the rules
        it breaks (judged with the keys of the run just made: call it right after it)."""
        index, side, problem = outcome
        return (side, problem.category, step_kind(steps[index] if index is not None else None),
                self._rules(steps, index, problem))

    def _diverged(self, k: int, steps: list[Step], seen: list[list[Seen]], outcome: Outcome,
                  until: float | None) -> None:
        index, side, problem = outcome
        signature = self._signature(steps, outcome)
        if any(d.signature == signature for d in self.summary.divergences):
            self.log(f"san model: sequence {k}: again {side}: {problem.category} after a {signature[2]} step")
            return
        self.log(f"san model: sequence {k}: {side}: {problem.message}; shrinking {len(steps)} steps")
        t0 = time.monotonic()
        if index is not None:
            steps = steps[:index + 1]

        def same(candidate: list[Step]) -> bool:
            got = self._replay(candidate)
            return got is not None and self._signature(candidate, got) == signature

        small, seens, final = steps, seen, outcome
        if not same(steps):  # not even the same steps again: nothing to shrink
            kind = "flaky"
        else:
            kind = "differential" if side == "both" else "model"
            replays = self.budget.shrink_replays
            if self.budget.differential:
                replays = min(replays, DIFFERENTIAL_REPLAYS)
            shrunk = shrink(steps, same, budget=replays, until=until)
            again: list[list[Seen]] = []
            got = self._replay(shrunk, again)
            if got is not None and self._signature(shrunk, got) == signature:
                small, seens, final = shrunk, again, got
        index, side, problem = final
        div = Divergence(kind, self.seed, k, side, problem, step_kind(small[index] if index is not None else None),
                         small, index=index, rules=self._rules(small, index, problem))
        div.lines = listing(self.world.plan, small, seens, self.names, index, problem)
        if kind == "flaky":
            div.lines.append("  (replayed, the same steps did not diverge: the backend's timing, or another user "
                             "of its hosts; run again)")
        self.summary.divergences.append(div)
        self.summary.shrinking += time.monotonic() - t0
        self.log(div.render())


def _add(a: Cost, b: Cost) -> Cost:
    return Cost(*(getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(Cost)))


def _show(answer: tuple[str, tuple[tuple[int, str], ...]]) -> str:
    call, done = answer
    return call + (" (" + ", ".join(f"op#{op} {status}" for op, status in done) + ")" if done else "")
