"""Which rules of CONTRACT.md section 3 a divergence breaks, so that the verdict counts it under them.

A divergence says what went wrong (``Problem.category`` and its message) at which step. The rules follow from
why the model expected what it did: the steps before it are replayed on a fresh model (no backend; the keys
the backend returned, where known), and the failing step is looked at in that state. A transfer the model
expected to be refused breaks the rules of each of its faults when it went through: a READ handle as a sink
(R6), a WRITE handle as a source (R7), a range outside the registration (R8), another socket's handle (R1),
another connection's descriptor (R2), a deregistered key (R3). An answer of the wrong kind (another error
code or status than the contract's, a legal call refused) is R14; what closing leaves is R11 (pins too); the
proxy's count otherwise R12; registrations and their reference counts and in-use marks R13; a socket's state R4.

Every divergence breaks at least one rule (R14 when nothing else says which), and only rules the model
checks (``MODEL_RULES``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..spi.contract import Access
from . import faults
from .faults import transfer_faults
from .invariants import Problem
from .kinds import kind_of
from .reference import Model
from .state import KeyValue
from .steps import Register, Step, Transfer

MODEL_RULES = ("R1", "R2", "R3", "R4", "R5", "R6", "R7", "R8", "R11", "R12", "R13", "R14")
"""The rules the model checks (CONTRACT.md section 3): the provider's; R9/R10 are the switch's, P1-P5 the
proxy driver's, which the scenarios check."""

ANSWERS = faults.ANSWERS
"""An answer of the wrong kind (section 2's codes and statuses), and any divergence nothing else names."""

R, W = int(Access.READ), int(Access.WRITE)


def broken_rules(problem: Problem, steps: Sequence[Step], index: int | None, fresh: Callable[[], Model],
                 keys: Mapping[int, KeyValue] | None = None) -> tuple[str, ...]:
    """The rules a divergence breaks: ``problem`` at ``steps[index]`` (``index`` None: when the sequence
    ended); ``fresh`` makes a model as the run's was at its start, ``keys`` (register step id -> what the
    backend returned) binds its registrations as the backend did."""
    category = problem.category
    step = steps[index] if index is not None and index < len(steps) else None
    if category == "proxy" and _closing(step):
        return ("R11",)  # what a close leaves pinned: closing releases everything
    fixed = {"probe": ANSWERS, "crash": ANSWERS, "differ": ANSWERS, "pending": ANSWERS, "leaks": "R11",
             "proxy": "R12", "state": "R4"}
    if category in fixed:
        return (fixed[category],)
    model = _before(fresh(), steps[:index] if index is not None else steps, keys or {})
    found: set[str] = set()
    if category == "key":
        found = _key(problem.message, step, model)
    elif category == "registrations":
        found = _registrations(problem.message, step)
    elif category == "call":
        found = _call(problem.message, step, model)
    elif category == "completion":
        found = _completion(problem.message, step, steps, lambda j: _before(fresh(), steps[:j], keys or {}))
    elif category == "bytes":
        found = kind_of(step).faults(step, model) if step is not None else set()
        found = found or {"R8"}
    return _ordered(found or {ANSWERS})


def _closing(step: Step | None) -> bool:
    """The sequence's end, or a step that closes sockets."""
    return step is None or kind_of(step).closes


def _ordered(rules: Iterable[str]) -> tuple[str, ...]:
    wanted = set(rules)
    return tuple(rule for rule in MODEL_RULES if rule in wanted)


# -- the model before the failing step ---------------------------------------------------------------

def _before(model: Model, steps: Sequence[Step], keys: Mapping[int, KeyValue]) -> Model:
    """``model`` moved on by ``steps`` as if the backend answered each as expected."""
    for step in steps:
        exp = model.apply(step)
        if not isinstance(step, Register) or exp.skip or exp.raises:
            continue
        if step.reg in keys:  # what the backend returned: a range registered again may get a key of its own (R13)
            model.bind(step, keys[step.reg])
        elif exp.fresh is not None:
            model.bind(step, _stand_in(step, model.traits.desc_size))
    return model


def _stand_in(step: Register, desc_size: int) -> KeyValue:
    """A key no backend answer and no junk key of the generator equals."""
    if step.kind == "memory":
        return (1 << 48) | step.reg
    return (b"\xa5" * desc_size + step.reg.to_bytes(8, "big"))[-desc_size:]


# -- each category -------------------------------------------------------------------------------------

def _key(message: str, step: Step | None, model: Model) -> set[str]:
    if "deregistered" in message:  # a key handed out again after its registration went (R3)
        return {"R3"}
    if "another live registration" not in message:
        return {ANSWERS}  # not a handle or descriptor at all
    if isinstance(step, Register) and step.sock in model.socks:
        # The key of the same range registered with more access: the provider widened this one to it.
        s = model.socks[step.sock]
        extra = 0
        for reg in s.regs.values():
            if reg.kind == step.kind and reg.view == step.view and reg.access != step.access:
                extra |= reg.access & ~step.access
        if extra:
            return ({"R6"} if extra & W else set()) | ({"R7"} if extra & R else set())
    return {"R13"}


def _registrations(message: str, step: Step | None) -> set[str]:
    """What differs between the provider's registrations and the model's, entry by entry (execute.py's
    message shows both as (kind, address, length, access, references) lists): more access than asked (R6, R7),
    other counts (R13), another range (R8), one a transfer made or another socket's (R1), one left by a close
    (R11)."""
    closing = _closing(step)
    found = re.search(r"the provider has (\[.*\]), the model (\[.*\])$", message)
    try:
        real, want = (ast.literal_eval(found.group(i)) for i in (1, 2)) if found else ([], [])
    except (ValueError, SyntaxError):
        real = want = []
    if not found:
        return {"R11"} if closing else {"R13"}
    real_refs = {tuple(r[:4]): r[4] for r in real}  # (kind, address, length, access) -> references
    want_refs = {tuple(r[:4]): r[4] for r in want}
    rules = {"R13"} if any(real_refs[k] != want_refs[k] for k in real_refs.keys() & want_refs.keys()) else set()
    left = sorted(real_refs.keys() - want_refs.keys())
    missing = sorted(want_refs.keys() - real_refs.keys())
    for entry in list(left):  # the same range with other access: more than asked (R6, R7), or less (R13)
        twin = next((m for m in missing if m[:3] == entry[:3]), None)
        if twin is None:
            continue
        left.remove(entry)
        missing.remove(twin)
        extra, less = int(entry[3]) & ~int(twin[3]), int(twin[3]) & ~int(entry[3])
        rules |= ({"R6"} if extra & W else set()) | ({"R7"} if extra & R else set()) | ({"R13"} if less else set())
    if left and sorted((k[0], k[3], real_refs[k]) for k in left) == sorted((k[0], k[3], want_refs[k])
                                                                           for k in missing):
        rules.add("R8")  # the same registrations, at another address or of another length
    elif left and isinstance(step, Transfer):
        rules.add("R1")  # a transfer registers nothing: the socket lists memory it never registered
    elif left or missing:
        rules.add("R11" if closing and left else "R13")
    return rules


def _call(message: str, step: Step | None, model: Model) -> set[str]:
    """A call answered otherwise than the model expected: the rules its step's type says (faults.py)."""
    return kind_of(step).broken(message, step, model) if step is not None else {ANSWERS}


def _completion(message: str, step: Step | None, steps: Sequence[Step], before: Callable[[int], Model]) -> set[str]:
    """An operation completed otherwise than expected: the transfer that posted it went through where one of its
    faults must refuse it (their rules, judged in the model as it was before that step: ``before(j)``);
    closing's flushes (R11, and R4 for the peer's); else R14."""
    found = re.search(r"op#(\d+)[^:]*: (\S+)[^,]*, expected (.*)$", message)
    if found is None:
        return {ANSWERS}
    op, status, expected = int(found.group(1)), found.group(2), set(re.findall(r"[A-Z_]{3,}", found.group(3)))
    posted = next((j for j, s in enumerate(steps) if isinstance(s, Transfer) and s.op == op), None)
    if posted is not None and status in ("SUCCESS", "still") and "SUCCESS" not in expected:  # done or pending
        transfer = steps[posted]
        assert isinstance(transfer, Transfer)
        return transfer_faults(transfer, before(posted)) or {ANSWERS}
    if _closing(step):
        if "ABORTED" in expected and "CONNECTION_RESET" not in expected:
            return {"R11"}  # pending operations of a closed socket complete ABORTED
        if "CONNECTION_RESET" in expected:
            return {"R4"}  # the peer's, when the other end went away
    return {ANSWERS}
