"""What each type of step is to every part of the model: the one place a step's type is dispatched on.

A sequence is made of seven types of step (steps.py). For each, ``KINDS`` says in one row:

- ``apply``: how the model moves on (reference.py's transition of that name);
- ``call``: the SPI call the engine adds to the step's batch (``direct`` instead for ``Reconnect``, whose
  ``connect_sockets`` no batch makes: prepared before the model moves on, made in place of the batch);
- ``answers``: what a call that went through answered, as a divergence shows it;
- ``op``: the pending operation its call returns, if any;
- ``took``: what the call returned, judged by invariants.py (and, a key, bound by the model);
- ``show``: the step in SPI terms, as a listing numbers it;
- ``closes``, ``broken``, ``faults``: what rules.py needs to say which rules a divergence at it breaks
  (faults.py).

A new type of step is its dataclass (steps.py), its transition (reference.py), a rule that draws it
(generate.py) and its row here: mypy checks the row's functions against the type, and a type without a row
fails the import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_args

from ..spi.contract import PAGE_SIZE, VALID_ACCESS, Access
from . import invariants
from .faults import answers_only, deregister_broken, no_faults, register_broken, transfer_broken, transfer_faults
from .invariants import Problem
from .steps import Close, Deregister, Getsockopt, Reconnect, Register, Scribble, Step, Transfer, pattern, show_view

if TYPE_CHECKING:
    from ..batch import Batch, Later
    from .handles import Handles
    from .naming import Namer
    from .reference import Model

S = TypeVar("S")


def _no_op(step: object) -> int | None:
    return None


def _fine(model: Model, step: object, value: object) -> Problem | None:
    return None


@dataclasses.dataclass(frozen=True)
class Kind(Generic[S]):
    """What the model, the engine and the listings do with a step of type ``S``."""

    apply: Callable[[Model, S], None]
    show: Callable[[Namer, S], str]
    answers: str | Callable[[S], str] = "done"
    call: Callable[[Handles, Model, Batch, S], Later[Any]] | None = None
    direct: Callable[[Handles, Model, S], Callable[[], None]] | None = None
    op: Callable[[S], int | None] = _no_op
    took: Callable[[Model, S, object], Problem | None] = _fine
    closes: bool = False  # what is left or flushed then is R11's
    broken: Callable[[str, S, Model], set[str]] = answers_only  # the rules a wrong answer to its call breaks
    faults: Callable[[S, Model], set[str]] = no_faults  # the rules its faults protect, once it is posted


# -- register_memory, register_rdma_memory ----------------------------------------------------------

def _register_call(on: Handles, model: Model, b: Batch, step: Register) -> Later[Any]:
    access: Any = Access(step.access) if step.access in VALID_ACCESS else step.access
    provider, sock = on.provider(step.sock), on.socks[step.sock]
    buffer = on.world.buffer(step.view, step.shape)
    if step.kind == "memory":
        return b.call(provider.register_memory, sock, buffer, access)
    return b.call(provider.register_rdma_memory, sock, buffer, access, step.size)


def _key(model: Model, step: Register, value: object) -> Problem | None:
    """A key invariants.py finds good is the model's from now on: later steps naming it use it."""
    problem = invariants.key(model, step, value)
    if problem is None:
        model.bind(step, value)
    return problem


def _show_register(namer: Namer, step: Register) -> str:
    p, b, off, _ = step.view
    where = {"range": show_view(step.view), "empty": f"p{p}/b{b}[{off}:{off}] (empty)",
             "overrun": f"p{p}/b{b}[{off}:{PAGE_SIZE + 1}] (one byte past the buffer's last page)",
             "unmapped": f"p{p}: 16 unmapped bytes a page after b{b}"}[step.shape]
    size = "" if step.size is None else f", descriptor_size={step.size}"
    return f"s{step.sock} {register_call(step.kind)}({where}, {_access(step.access)}{size})"


def register_call(kind: str) -> str:
    """The provider's method a register step of ``kind`` calls."""
    return "register_memory" if kind == "memory" else "register_rdma_memory"


def _access(value: int) -> str:
    return str(Access(value).name) if value in (1, 2, 3) else f"access={value}"


# -- deregister_memory, deregister_rdma_memory --------------------------------------------------------

def _deregister_call(on: Handles, model: Model, b: Batch, step: Deregister) -> Later[Any]:
    provider, sock = on.provider(step.sock), on.socks[step.sock]
    value: Any = model.value(step.key)
    if step.kind == "memory":
        return b.call(provider.deregister_memory, sock, value)
    return b.call(provider.deregister_rdma_memory, sock, value)


def _show_deregister(namer: Namer, step: Deregister) -> str:
    call = "deregister_memory" if step.kind == "memory" else "deregister_rdma_memory"
    return f"s{step.sock} {call}({namer.key(step.key, step.kind)})"


# -- rdma_write, rdma_read, send, recv ------------------------------------------------------------------

def _transfer_call(on: Handles, model: Model, b: Batch, step: Transfer) -> Later[Any]:
    provider, sock = on.provider(step.sock), on.socks[step.sock]
    # Whatever the step names goes to the provider as it is: a junk key or descriptor is the point.
    entries: Any = [(on.world.buffer(view), model.value(key)) for view, key in step.entries]
    desc: Any = model.value(step.desc)
    if step.kind == "rdma_write":
        return b.call(provider.rdma_write, sock, entries, desc, step.offset)
    if step.kind == "rdma_read":
        return b.call(provider.rdma_read, sock, entries, desc, step.offset)
    return b.call(provider.send if step.kind == "send" else provider.recv, sock, entries)


def _show_transfer(namer: Namer, step: Transfer) -> str:
    items = ", ".join(f"{show_view(v)} {namer.key(k, 'memory')}" for v, k in step.entries)
    if step.desc is None:
        return f"s{step.sock} {step.kind}([{items}])"
    return f"s{step.sock} {step.kind}([{items}], {namer.key(step.desc, 'rdma')}, offset {step.offset})"


# -- the application writing its own memory -----------------------------------------------------------

def _scribble_call(on: Handles, model: Model, b: Batch, step: Scribble) -> Later[Any]:
    pi, bi, off, n = step.view
    return b.call(on.world.bufs[pi][bi].write, pattern(step.seed, n), off)


def _show_scribble(namer: Namer, step: Scribble) -> str:
    return f"p{step.view[0]} writes {step.view[3]} bytes into {show_view(step.view)}"


# -- close_socket, getsockopt, reconnecting -------------------------------------------------------------

def _close_call(on: Handles, model: Model, b: Batch, step: Close) -> Later[Any]:
    return b.call(on.provider(step.sock).close_socket, on.socks[step.sock])


def _getsockopt_call(on: Handles, model: Model, b: Batch, step: Getsockopt) -> Later[Any]:
    s = model.socks[step.sock]
    via = s.peer.id if step.foreign and s.peer is not None else step.sock
    option: Any = step.option  # a junk option is the point
    return b.call(on.provider(via).getsockopt, on.socks[step.sock], option)


def _show_getsockopt(namer: Namer, step: Getsockopt) -> str:
    via = " through its peer's provider" if step.foreign else ""
    return f"s{step.sock} getsockopt({step.option!r}){via}"


def _reconnect(on: Handles, model: Model, step: Reconnect) -> Callable[[], None]:
    """The sockets of the slot still open (asked before the model closes them), closed, then a new pair."""
    closes = model.closes(step)

    def make() -> None:
        for sock_id in closes:
            on.provider(sock_id).close_socket(on.socks[sock_id])
        on.connected(step.slot, step.socks, on.world.connect(step.slot))

    return make


def _show_reconnect(namer: Namer, step: Reconnect) -> str:
    a, b = step.socks
    return f"reconnect slot {step.slot}: close what is open of it, connect s{a} to s{b}"


KINDS: dict[type, Kind[Any]] = {
    Register: Kind[Register](apply=lambda model, step: model.register(step), show=_show_register,
                             answers=lambda step: "handle" if step.kind == "memory" else "descriptor",
                             call=_register_call, took=_key, broken=register_broken),
    Deregister: Kind[Deregister](apply=lambda model, step: model.deregister(step), show=_show_deregister,
                                 call=_deregister_call, broken=deregister_broken),
    Transfer: Kind[Transfer](apply=lambda model, step: model.transfer(step), show=_show_transfer,
                             answers="operation", call=_transfer_call, op=lambda step: step.op,
                             broken=transfer_broken, faults=transfer_faults),
    Scribble: Kind[Scribble](apply=lambda model, step: model.scribble(step), show=_show_scribble,
                             call=_scribble_call),
    Close: Kind[Close](apply=lambda model, step: model.close(step),
                       show=lambda namer, step: f"s{step.sock} close_socket()", call=_close_call, closes=True),
    Getsockopt: Kind[Getsockopt](apply=lambda model, step: model.getsockopt(step), show=_show_getsockopt,
                                 answers="value", call=_getsockopt_call,
                                 took=lambda model, step, value: invariants.option_value(value)),
    Reconnect: Kind[Reconnect](apply=lambda model, step: model.reconnect(step), show=_show_reconnect,
                               direct=_reconnect, closes=True),
}


if set(KINDS) != set(get_args(Step)):
    raise TypeError(f"kinds.py: every type of step needs its row, and only those: {set(KINDS) ^ set(get_args(Step))}")


def kind_of(step: Step) -> Kind[Any]:
    """The row of ``step``'s type."""
    return KINDS[type(step)]


def answered(step: Step) -> str:
    """What ``step``'s call answers when it goes through: "handle", "descriptor", "operation", "value", "done"."""
    answers = kind_of(step).answers
    return answers if isinstance(answers, str) else answers(step)
