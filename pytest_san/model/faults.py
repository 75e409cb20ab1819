"""Why the model refuses a step: the rules of CONTRACT.md section 3 each of its faults protects.

rules.py sorts a divergence by what went wrong. Where that depends on the type of the step that went wrong,
the step's row of kinds.py names the function here: ``broken`` for a call answered otherwise than the model
expected, ``faults`` for a transfer that moved what it must not.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..spi.contract import VALID_ACCESS, Access
from .state import MReg, MSock
from .steps import Deregister, Register, Transfer

if TYPE_CHECKING:
    from .reference import Model

ANSWERS = "R14"
"""An answer of the wrong kind (section 2's codes and statuses), and any divergence nothing else names."""

R, W = int(Access.READ), int(Access.WRITE)

# What a fault found at the call protects (pytest_san.spi.checks' ids, as the model names them).
CALL_FAULTS: dict[str, tuple[str, ...]] = {
    "socket": ("R4",), "connected": ("R4",),
    "buffer.owner": ("R1", "R5"), "entry.owner": ("R1", "R5"),
}
_RETURNED = ("handle", "descriptor", "operation", "done", "value")
"""What a call that went through answered (execute.py's ``Seen.call``)."""


def _went_through(message: str) -> bool:
    found = re.match(r"(?:answered )?([A-Za-z_]+)", message)
    return (found.group(1) if found else "") in _RETURNED


# -- a call answered otherwise than the model expected: went through where it must be refused (the rules of its
# faults), or answered with the wrong error code, or refused where it must go through (R14) -------------------

def answers_only(message: str, step: object, model: Model) -> set[str]:
    """A step whose call has no fault the model refuses it for: any wrong answer is one of the wrong kind."""
    return {ANSWERS}


def register_broken(message: str, step: Register, model: Model) -> set[str]:
    faults = _register_faults(step, model)
    if _went_through(message):
        return set().union(*(CALL_FAULTS.get(f, (ANSWERS,)) for f in faults)) if faults else {ANSWERS}
    s = model.socks.get(step.sock)
    return {"R13"} if not faults and s is not None and s.same(step.kind, step.view, step.access) else {ANSWERS}


def deregister_broken(message: str, step: Deregister, model: Model) -> set[str]:
    """Unknown, another socket's, stale or in use: reference counts and in-use marks (R13), and whose it was."""
    went_through = _went_through(message)
    rules = {"R13"}
    s = model.socks.get(step.sock)
    if s is not None and s.state == "closed":
        return {"R4"} if went_through else {ANSWERS}
    if not went_through and "expected WSA" in message:  # refused, with another code
        return {ANSWERS}
    if went_through and s is not None:  # another socket's handle (R1), or a deregistered key (R3)
        rules |= _foreign(s, "memory" if step.kind == "memory" else "rdma", model.value(step.key), model) - {"R2"}
    return rules


def transfer_broken(message: str, step: Transfer, model: Model) -> set[str]:
    if not _went_through(message):
        return {ANSWERS}
    faults = _transfer_call_faults(step, model)
    return set().union(*(CALL_FAULTS.get(f, (ANSWERS,)) for f in faults)) if faults else {ANSWERS}


def no_faults(step: object, model: Model) -> set[str]:
    return set()


# -- the faults of each type of step --------------------------------------------------------------------

def _socket_faults(state: str) -> list[str]:
    """What a socket in ``state`` faults first: a closed one is no socket, any other not connected."""
    if state == "closed":
        return ["socket"]
    return [] if state == "connected" else ["connected"]

def _register_faults(step: Register, model: Model) -> list[str]:
    s = model.socks.get(step.sock)
    if s is None:
        return []
    faults = _socket_faults(s.state)
    if step.view[0] != s.proc:
        faults.append("buffer.owner")
    if step.shape != "range":
        faults.append("buffer.mapped")
    if step.access not in VALID_ACCESS:
        faults.append("access")
    if step.kind == "rdma" and step.size is not None and step.size < model.traits.desc_size:
        faults.append("descriptor_size.small")
    return faults


def _transfer_call_faults(step: Transfer, model: Model) -> list[str]:
    s = model.socks.get(step.sock)
    if s is None:
        return []
    faults = _socket_faults(s.state)
    if any(view[0] != s.proc for view, _ in step.entries):
        faults.append("entry.owner")
    desc = model.value(step.desc) if step.desc is not None else None
    if step.kind.startswith("rdma") and isinstance(desc, bytes) and len(desc) != model.traits.desc_size:
        faults.append("descriptor")
    return faults


def transfer_faults(step: Transfer, model: Model) -> set[str]:
    """The rules that refuse a transfer once posted: its local entries (R1, R3, R6, R7, R8) and, for RDMA, the
    peer's window (R2, R3, R6, R7, R8)."""
    s = model.socks.get(step.sock)
    if s is None:
        return set()
    rules = {rule for f in _transfer_call_faults(step, model) for rule in CALL_FAULTS.get(f, ())}
    source = step.kind in ("rdma_write", "send")
    for (pi, bi, off, n), key in step.entries:
        value = model.value(key)
        reg = s.live("memory", value) if value is not None else None
        if reg is None:
            rules |= _foreign(s, "memory", value, model) or {"R1"}  # unregistered memory moves nothing
            continue
        rpi, rbi, roff, rn = reg.view
        if source and not reg.access & R:
            rules.add("R7")
        if not source and not reg.access & W:
            rules.add("R6")
        if (pi, bi) != (rpi, rbi) or off < roff or off + n > roff + rn:
            rules.add("R8")
    if step.kind.startswith("rdma") and s.peer is not None:
        desc = model.value(step.desc) if step.desc is not None else None
        win = s.peer.live("rdma", desc) if isinstance(desc, bytes) else None
        if win is None:
            rules |= _foreign(s.peer, "rdma", desc, model) or {"R2"}
        else:
            write = step.kind == "rdma_write"
            if write and not win.access & W:
                rules.add("R6")
            if not write and not win.access & R:
                rules.add("R7")
            if step.offset < 0 or step.offset + sum(v[3] for v, _ in step.entries) > win.view[3]:
                rules.add("R8")
    return rules


def _foreign(s: MSock, kind: str, value: object, model: Model) -> set[str]:
    """Why ``value`` is not a live key of ``kind`` on ``s``: another socket's (R1 for a handle, R2 for a
    descriptor), deregistered or closed (R3), or nothing at all (empty)."""
    own = "R1" if kind == "memory" else "R2"
    if value is None:
        return set()
    regs: list[MReg] = [r for r in model.regs.values() if r.kind == kind and type(r.key) is type(value)
                        and r.key == value]
    if not regs or any(r.live and r.sock is s for r in regs):  # junk, or live here (in use: R13 alone)
        return set()
    if any(r.live and r.sock is not s for r in regs):
        return {own}
    rules = {"R3"}
    if any(r.sock is not s for r in regs):
        rules.add(own)
    return rules
