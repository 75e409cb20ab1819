"""The checks: what a backend answered to a step, and what it holds after it, held to the model.

Each check is a function of the model (with what it expects of the step) and of what was read from the
backend, returning the problems it finds; none makes a call. The engine (execute.py's ``Side``) makes the
step's call and the reads in one batch and hands their answers in.

After every step the state checks compare ``registrations(socket)`` (kind, range, access, references), each
proxy's live allocations (R12: a pin per live registration, or per register call), every byte of the buffers
(guards included), each socket's ``connected``/``closed``, and that operations the model holds pending are
still pending. With ``full`` checks (the emulator: every call is cheap) all of it after every step;
otherwise (a lab: every call is a round trip) only what the step could change (``Expect.touched``), and all
of it when the sequence ends, with ``backend.leaks()``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..spi.contract import Completion, SanError
from .state import Expect, KeyValue, Statuses, not_a_key
from .steps import Register, View

if TYPE_CHECKING:
    from .reference import Model  # the model imports kinds.py, which judges with these


@dataclasses.dataclass
class Problem:
    category: str  # call, key, completion, pending, registrations, proxy, bytes, state, leaks, crash, differ
    message: str


# -- the call's answer ---------------------------------------------------------------------------------

_RETURNS = {"handle": "a handle", "descriptor": "a descriptor", "op": "a pending operation", "none": "it to return",
            "value": "an integer"}


def answer(exp: Expect, call: str, result: object) -> Problem | None:
    """The call's ``result`` (what it returned or raised, shown as ``call``) against ``exp``: the error code it
    must raise, or that it returns (or raises one of the codes ``exp.instead`` allows at the call)."""
    allowed: frozenset[str] = frozenset().union(*exp.instead.values())
    if exp.raises:
        if not (isinstance(result, SanError) and result.code.name in exp.raises):
            return Problem("call", f"answered {call}, expected {' or '.join(sorted(exp.raises))}")
    elif isinstance(result, BaseException):
        category = "call" if isinstance(result, SanError | TypeError | ValueError) else "crash"
        instead = f" (or {' or '.join(sorted(allowed))} at the call)" if allowed else ""
        return Problem(category, f"answered {call}, expected {_RETURNS[exp.returns]}{instead}")
    return None


def key(model: Model, step: Register, value: object) -> Problem | None:
    """The key a register call returned: a handle or a descriptor of the probed size (R14), never one
    deregistered on that connection before (R3), nor the key of another live registration (R13)."""
    call = "register_memory" if step.kind == "memory" else "register_rdma_memory"
    why = not_a_key(step.kind, value, model.traits.desc_size)
    if why:
        return Problem("key", f"{call} returned {value!r:.80}, {why}")
    returned: KeyValue = value
    sock = model.socks[step.sock]
    if step.kind == "rdma" and returned in sock.released:  # a stale copy of it would reach this registration's memory
        return Problem("key", f"{call} returned {returned!r}, a descriptor deregistered on this connection before "
                              "(R3: never handed out again on it)")
    mine = (step.kind, step.view, step.access)
    clash = [r for r in sock.regs.values() if r.kind == step.kind and r.key == returned and r.key is not None
             and (r.kind, r.view, r.access) != mine]
    if clash:  # a key may name the same range again (R13), never another live registration
        return Problem("key", f"returned {returned!r}, already the key of another live registration")
    return None


def option_value(value: object) -> Problem | None:
    """What getsockopt returned: a non-negative integer."""
    if type(value) is not int or value < 0:
        return Problem("call", f"getsockopt returned {value!r:.40}, not a non-negative integer")
    return None


def completion(op_id: int, expected: tuple[Statuses, int], done: Completion | Exception) -> tuple[str, Problem | None]:
    """An operation's completion (or why waiting for it failed) against the statuses and byte count expected:
    how it is shown, and the problem."""
    statuses, nbytes = expected
    want = " or ".join(sorted(s.name for s in statuses)) + (f" {nbytes} bytes" if nbytes else "")
    if isinstance(done, Exception):
        shown = "still pending" if isinstance(done, TimeoutError) else repr(done)
        return shown, Problem("completion", f"operation of step op#{op_id}: {shown}, expected {want}")
    shown = done.status.name + (f" {done.bytes} bytes" if done.bytes else "")
    if done.status not in statuses or done.bytes != nbytes:
        return shown, Problem("completion", f"operation op#{op_id}: {shown}, expected {want}")
    return shown, None


def leaks(left: Iterable[object]) -> list[Problem]:
    """What ``backend.leaks()`` listed once every socket was closed: nothing may be left (R11)."""
    shown = [str(leak) for leak in left]
    return [Problem("leaks", "still alive after every socket was closed (R11): " + "; ".join(shown))] if shown else []


# -- the backend's state -------------------------------------------------------------------------------

Asked = tuple[Any, ...]
"""What a check asks, as a key: ("registrations", sock), ("live", node), ("bytes", proc, buf),
("connected", sock), ("closed", sock), ("pending", op)."""


@dataclasses.dataclass
class Checked:
    """What a check compares: sockets' registrations, proxies, buffers, sockets' states, pending operations."""

    registrations: list[int]
    nodes: list[int]
    buffers: list[tuple[int, int]]
    states: list[int]
    pending: list[int]


def compared(model: Model, exp: Expect, *, full: bool, nodes: int, known: set[int]) -> Checked:
    """What a check after a step with expectation ``exp`` compares in ``model`` (of ``nodes`` nodes): all of
    it with ``full``, else what the step touched; of the pending operations, those ``known`` (a call returned
    them) that no race asks about already."""
    touched = exp.touched
    everyone = list(model.socks)
    waiting = {op for _, op in model.waiting_sends()} if not full else set()  # catch_up asks about those
    return Checked(
        registrations=everyone if full else sorted(touched.registrations),
        nodes=list(range(nodes)) if full else sorted(touched.nodes),
        buffers=sorted(model.data) if full else sorted(touched.buffers),
        states=everyone if full else sorted(touched.states),
        pending=[op_id for op_id, mop in sorted(model.ops.items())
                 if (full or (mop.sock.id in touched.pending and op_id not in waiting)) and op_id in known])


def covers(looked: Checked, checked: Checked) -> bool:
    """Whether what was read (``looked``) holds all that ``checked`` compares."""
    return all(set(getattr(checked, f.name)) <= set(getattr(looked, f.name)) for f in dataclasses.fields(Checked))


def state(model: Model, checked: Checked, ask: Callable[[Asked], Any], *, full: bool, baseline: Sequence[int],
          address: Callable[[View], int]) -> list[Problem]:
    """The backend's state (``checked``, as ``ask`` answers it) held to the model's: each difference a problem.
    ``baseline``: each proxy's allocations before the run; ``address``: where a view of a buffer lies."""
    problems: list[Problem] = []
    for sock_id in checked.registrations:
        problems += _registrations(model, sock_id, ask, address)
    for node in checked.nodes:
        problems += _proxy(model, node, ask, baseline[node])
    for pi, bi in checked.buffers:
        problems += _bytes(model, pi, bi, ask)
    for sock_id in checked.states:
        problems += _state(model, sock_id, ask, full=full,
                           closed_too=full or model.socks[sock_id].state == "closed")
    for op_id in checked.pending:
        problems += _pending(model, op_id, ask)
    return problems


def _registrations(model: Model, sock_id: int, ask: Callable[[Asked], Any],
                   address: Callable[[View], int]) -> list[Problem]:
    msock = model.socks[sock_id]
    try:
        regs = ask(("registrations", sock_id))
        real = _references((r.kind, r.address, r.length, int(r.access), r.refs) for r in regs)
    except SanError as exc:  # a closed socket holds nothing, whichever way the provider says so
        if msock.state != "closed":
            return [Problem("registrations", f"registrations(s{sock_id}) raised {exc!r}")]
        return []
    except Exception as exc:
        return [Problem("registrations", f"registrations(s{sock_id}) raised or returned junk: {exc!r}")]
    want = _references((r.kind, address(r.view), r.view[3], r.access, r.refs) for r in msock.regs.values())
    if real != want:
        return [Problem("registrations", f"registrations of s{sock_id}: the provider has {real}, the model {want}")]
    return []


def _proxy(model: Model, node: int, ask: Callable[[Asked], Any], base: int) -> list[Problem]:
    try:
        live = ask(("live", node))
    except Exception as exc:  # whatever a provider answers, the model reports it, never fails itself
        return [Problem("proxy", f"proxy of node {node}: asking it raised {exc!r}")]
    low, high = model.live_registrations(node)
    if not base + low <= live <= base + high:
        want = f"{base + low}" if low == high else f"{base + low} to {base + high}"
        return [Problem("proxy", f"proxy of node {node}: {live!r} live allocations, the model has {want} "
                                 "(R12: at least one per live registration, at most one per register call "
                                 "it answered)")]
    return []


def _bytes(model: Model, pi: int, bi: int, ask: Callable[[Asked], Any]) -> list[Problem]:
    want = bytes(model.data[pi, bi])
    real = ask(("bytes", pi, bi))
    if real != want:
        diff = [i for i in range(len(want)) if i >= len(real) or real[i] != want[i]]
        return [Problem("bytes", f"p{pi}/b{bi}: bytes {diff} differ from the model: {real.hex()} != {want.hex()}")]
    return []


def _state(model: Model, sock_id: int, ask: Callable[[Asked], Any], *, full: bool,
           closed_too: bool) -> list[Problem]:
    state = model.socks[sock_id].state
    if state == "closed" and not full:  # a closed socket: only whether it is closed
        if not ask(("closed", sock_id)):
            return [Problem("state", f"s{sock_id}: closed=False, the model says closed")]
        return []
    problems = []
    if ask(("connected", sock_id)) != (state == "connected"):
        problems.append(Problem("state", f"s{sock_id}: connected={state != 'connected'}, the model says {state}"))
    if closed_too and ask(("closed", sock_id)) != (state == "closed"):
        problems.append(Problem("state", f"s{sock_id}: closed={state != 'closed'}, the model says {state}"))
    return problems


def _pending(model: Model, op_id: int, ask: Callable[[Asked], Any]) -> list[Problem]:
    mop = model.ops[op_id]
    try:
        completion = ask(("pending", op_id))
    except TimeoutError:
        return []  # still pending, as the model holds it
    except Exception as exc:
        return [Problem("pending", f"op#{op_id} ({mop.kind} on s{mop.sock.id}): asking it raised {exc!r}")]
    return [Problem("pending", f"op#{op_id} ({mop.kind} on s{mop.sock.id}) completed {completion}, the model "
                               "holds it pending")]


def _references(regs: Iterable[tuple[str, int, int, int, int]]) -> list[tuple[str, int, int, int, int]]:
    """(kind, address, length, access, references) per distinct range: one registration of two references and
    two of one each are the same to R13 (a provider may answer a second registration with a new key)."""
    total: collections.Counter[tuple[str, int, int, int]] = collections.Counter()
    for kind, address, length, access, refs in regs:
        total[kind, address, length, access] += refs
    return sorted((*key, refs) for key, refs in total.items())
