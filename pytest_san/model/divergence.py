"""A divergence as someone who never saw the model reads it: the shrunk steps, numbered, in SPI terms,
with what each backend answered (and, at the step that went wrong, what the model expected)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .execute import Seen
from .invariants import Problem
from .kinds import kind_of
from .naming import Namer
from .state import Expect
from .steps import Plan, Step


@dataclasses.dataclass
class Divergence:
    kind: str  # "model": a backend answered otherwise than the model; "differential": two backends differ;
    # "regression": a sequence of regressions.py failed again; "flaky": the same steps replayed did not diverge
    seed: int
    sequence: int
    side: str  # the backend that went wrong, or "both" (differential)
    problem: Problem
    step_kind: str  # what kind of step went wrong ("end": the checks when the sequence ended)
    steps: list[Step]
    lines: list[str] = dataclasses.field(default_factory=list)
    name: str = ""  # a regression's name (regressions.py)
    index: int | None = None  # the step of ``steps`` that went wrong (None: the checks when the sequence ended)
    rules: tuple[str, ...] = ()  # the rules it breaks (rules.py): the verdict counts it under each

    @property
    def signature(self) -> tuple[str, str, str, tuple[str, ...]]:
        return self.side, self.problem.category, self.step_kind, self.rules

    def title(self) -> str:
        where = f"seed {self.seed}, sequence {self.sequence}, {len(self.steps)} steps after shrinking"
        if self.kind == "regression":
            where = f"regression: {self.name}"
        elif self.kind == "flaky":
            where = f"seed {self.seed}, sequence {self.sequence}, {len(self.steps)} steps; did not reproduce"
        breaks = f", breaking {', '.join(self.rules)}" if self.rules else ""
        return f"{self.side}: {self.problem.category} after a {self.step_kind} step{breaks} ({where})"

    def render(self) -> str:
        return "\n".join([self.title(), *self.lines])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "sequence": self.sequence, "side": self.side,
                "category": self.problem.category, "step": self.step_kind, "message": self.problem.message,
                "rules": list(self.rules), "steps": list(self.lines)}


def step_kind(step: Step | None) -> str:
    if step is None:
        return "end"
    kind = getattr(step, "kind", "")
    return f"{type(step).__name__}({kind})" if kind else type(step).__name__


def answer(seen: Seen, step: Step, namer: Namer) -> str:
    """What a backend answered, e.g. "WSAEFAULT", "handle", "SUCCESS 16 bytes", "pending"."""
    own = kind_of(step).op(step)
    if seen.call == "operation":
        text = seen.done.get(own, "pending") if own is not None else "operation"
    else:
        text = seen.call
    others = [f"{namer.op(op)} {status}" for op, status in sorted(seen.done.items()) if op != own]
    return text + (f" (and {', '.join(others)})" if others else "")


def expected(exp: Expect, step: Step, namer: Namer) -> str:
    if exp.raises:
        return " or ".join(sorted(exp.raises))
    own = kind_of(step).op(step)
    def status(op: int) -> str:
        statuses, nbytes = exp.done[op]
        return " or ".join(sorted(s.name for s in statuses)) + (f" {nbytes} bytes" if nbytes else "")
    text = {"handle": "handle", "descriptor": "descriptor", "none": "done"}.get(exp.returns, "")
    if exp.returns == "op":
        text = status(own) if own in exp.done else "pending"
    others = [f"{namer.op(op)} {status(op)}" for op in sorted(exp.done) if op != own]
    return text + (f" (and {', '.join(others)})" if others else "")


def listing(plan: Plan, steps: Sequence[Step], seens: Sequence[Sequence[Seen]], names: Sequence[str],
            failed: int | None, problem: Problem) -> list[str]:
    """The numbered steps; ``seens[i]``: each side's answer to step i (sides in ``names`` order)."""
    namer = Namer(steps)
    lines = [f"  setup: {plan.describe()}; socket 2k and 2k+1 are the ends of slot k"]
    for i, step in enumerate(steps):
        sides = seens[i] if i < len(seens) else []
        said = "; ".join(f"{name}: {answer(seen, step, namer)}" for name, seen in zip(names, sides, strict=False))
        if len(names) == 1 and i == failed and sides:
            said += f" (the model: {expected(sides[0].expect, step, namer)})"
        lines.append(f"  {i + 1}. {namer.step(step)} -> {said or 'not run'}")
        if i == failed:
            lines.append(f"     ^ {problem.message}")
    if failed is None:
        lines.append(f"  then every socket closed: {problem.message}")
    return lines
