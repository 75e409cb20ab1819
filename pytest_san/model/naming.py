"""Listings name things by the step that made them: "handle#2" is what step 2 returned, "step 4's recv"."""

from __future__ import annotations

from collections.abc import Sequence

from .kinds import kind_of
from .steps import Key, Register, Step, Transfer


class Namer:
    """Names keys by the step of the listing that made them ("handle#2": what step 2 returned)."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.made = {step.reg: i + 1 for i, step in enumerate(steps) if isinstance(step, Register)}
        self.kinds = {step.reg: step.kind for step in steps if isinstance(step, Register)}
        self.ops = {step.op: (i + 1, step.kind) for i, step in enumerate(steps) if isinstance(step, Transfer)}

    def op(self, op: int) -> str:
        """The pending operation a step made, by the step's number: "step 4's recv"."""
        number, kind = self.ops.get(op, (0, "operation"))
        return f"step {number}'s {kind}" if number else f"op#{op}"

    def key(self, key: Key, kind: str) -> str:
        if key.reg is None:
            value = key.junk
            if isinstance(value, bytes):
                return f"junk descriptor {value.hex()}" if value else "junk descriptor (empty)"
            return f"junk handle {value!r}"
        noun = "descriptor" if self.kinds.get(key.reg, kind) == "rdma" else "handle"
        name = f"{noun}#{self.made[key.reg]}" if key.reg in self.made else f"{noun} of a dropped step"
        if key.cut > 0:
            return f"{name} minus its last {key.cut} byte(s)"
        return f"{name} plus {-key.cut} zero byte(s)" if key.cut < 0 else name

    def step(self, step: Step) -> str:
        """``step`` in SPI terms (each type's words are its row of kinds.py)."""
        show: str = kind_of(step).show(self, step)
        return show
