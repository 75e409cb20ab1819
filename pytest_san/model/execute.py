"""One backend running a sequence: each step called through the public API, judged against the model.

After every step the checks compare the backend's state with the model's: ``registrations(socket)``
(kind, range, access, references), each proxy's live allocations (R12: a pin per live registration, or per
register call),
every byte of the buffers (guards included), each socket's ``connected``/``closed``, and that
operations the model holds pending are still pending. With ``full`` checks (the emulator: every call
is cheap) all of it after every step; otherwise (a lab: every call is a round trip) only what the step
could change (``Expect.touched``), and all of it when the sequence ends, with ``backend.leaks()``.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from ..batch import Batch, Later, batch, is_closed, is_connected, wait_for
from ..spi.contract import VALID_ACCESS, Access, Completion, SanError, Status
from ..spi.protocols import PendingOperation, Provider, Socket
from .alternatives import RNR_BOUNDED
from .reference import Model
from .state import Expect, KeyValue, Touched, Traits, not_a_key
from .steps import Close, Deregister, Getsockopt, Reconnect, Register, Scribble, Step, Transfer, View, pattern
from .world import World


@dataclasses.dataclass
class Problem:
    category: str  # call, key, completion, pending, registrations, proxy, bytes, state, leaks, crash, differ
    message: str


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
    if isinstance(step, Register):
        return "handle" if step.kind == "memory" else "descriptor"
    if isinstance(step, Getsockopt):
        return "value"
    return "operation" if isinstance(step, Transfer) else "done"


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


Looked = tuple[Checked, dict[Asked, Any]]
"""What a step's batch read for the check after it: what it was to compare, and each read's ``Later``."""


Closing = tuple[int, Expect, Later[None], dict[int, Later[Completion]]]
"""A close made in a batch: the socket, what the model expects of it, the close's ``Later``, its waits."""


@dataclasses.dataclass
class Made:
    """A step made: what its call returned or raised, the waits for the completions the model expected (empty
    when the call raised: those are looked at one by one), and what the batch read for the check."""

    result: object
    waits: dict[int, Later[Completion]]
    looked: Looked | None


def _covers(looked: Checked, checked: Checked) -> bool:
    """Whether what was read (``looked``) holds all that ``checked`` compares."""
    return all(set(getattr(checked, f.name)) <= set(getattr(looked, f.name)) for f in dataclasses.fields(Checked))


GIVE_UP_AFTER = 1.0
"""Seconds a send waits before a backend with ``send-wait-bounded`` may end it (rxe: about 2 s): younger
sends are not asked about (each question is a round trip)."""

_RETURNS = {"handle": "a handle", "descriptor": "a descriptor", "op": "a pending operation", "none": "it to return",
            "value": "an integer"}


class Side:
    """``world``'s backend running sequences, expected to have ``traits`` (its ``desc_size`` is probed when a
    sequence starts; ``sends_wait`` is the backend under test's on both sides of a differential run); ``full``:
    check everything after every step (where calls are cheap)."""

    def __init__(self, name: str, world: World, traits: Traits, *, full: bool, timeout: float = 30.0) -> None:
        self.name = name
        self.world = world
        self.traits = traits
        self.full = full
        self.timeout = timeout
        self.model: Model | None = None
        self.socks: dict[int, Socket] = {}
        self.nodes_of: dict[int, int] = {}  # socket -> the index of its node
        self.ops: dict[int, PendingOperation] = {}
        self._popped: dict[int, PendingOperation] = {}  # completed in this step (run may judge it twice)
        self.posted: dict[int, float] = {}  # op -> when it was posted (time.monotonic)
        self.cost = Cost()

    def start(self) -> Model:
        """Connect the sequence's sockets, rewrite the buffers; a fresh model."""
        t0 = time.perf_counter()
        self.ops, self.socks, self.nodes_of = {}, {}, {}
        world = self.world
        slots = range(len(world.plan.slots))
        # Every slot's connect at once (a lab: every host's listens in one round trip, then its connects).
        with batch(world.backend) as b:
            connects = [b.call(world.backend.connect_sockets, *world.pair(slot)) for slot in slots]
        for slot, connected in zip(slots, connects, strict=True):
            self._connected(slot, (2 * slot, 2 * slot + 1), connected.value)
        desc_size = self.world.probe(self.socks[0])
        self.world.fresh_bytes()
        self.world.forget_bytes()  # known again when the sequence ends as the model says
        self.model = Model(self.world.plan, dataclasses.replace(self.traits, desc_size=desc_size))
        self.cost.setup += time.perf_counter() - t0
        return self.model

    def _connect(self, slot: int, ids: tuple[int, int]) -> None:
        self._connected(slot, ids, self.world.connect(slot))

    def _connected(self, slot: int, ids: tuple[int, int], pair: tuple[Socket, Socket]) -> None:
        plan = self.world.plan
        self.socks[ids[0]], self.socks[ids[1]] = pair
        for sock_id, proc in zip(ids, plan.slots[slot], strict=True):
            self.nodes_of[sock_id] = plan.nodes[proc]

    def _provider(self, sock: int) -> Provider:
        return self.world.nodes[self.nodes_of[sock]].provider

    # -- one step --------------------------------------------------------------------------------

    def run(self, step: Step) -> Seen:
        model = self.model
        assert model is not None
        t = time.perf_counter()
        gave_up = self.catch_up()
        self.cost.checks += time.perf_counter() - t
        # A send may give up waiting between that look and the call: then the step is judged again (below).
        racy = copy.deepcopy(model) if self._old_waiting_sends(model) else None
        closes = model.closes(step) if isinstance(step, Reconnect) else []
        seen = _merged(Seen(model.apply(step)), gave_up)
        if seen.expect.skip:
            seen.call = "skipped"
            return seen
        t0 = time.perf_counter()
        made = self._made(step, closes, seen)
        self._popped = {}
        self._judge_answer(step, seen, made.result, made.waits)
        if seen.problems and racy is not None and self._gave_up_meanwhile(racy):
            self.ops.update(self._popped)  # their completions are kept: waiting again answers the same
            vars(model).update(vars(racy))  # in place: the generator holds this model
            seen = _merged(Seen(model.apply(step)), _merged(self.catch_up() or Seen(Expect()), gave_up))
            self._judge_answer(step, seen, made.result)
        t1 = time.perf_counter()
        self._settled_check(seen, full=self.full, looked=made.looked)
        self.cost.calls += t1 - t0
        self.cost.checks += time.perf_counter() - t1
        self.cost.steps += 1
        return seen

    def _made(self, step: Step, closes: list[int], seen: Seen) -> Made:
        """The step made as one batch (a lab: one round trip per host, two where a host must see what another's
        operation did): its call, the waits for the completions the model expects of it (each made only if the
        call returned), a barrier, then every read the check after it makes."""
        exp = seen.expect
        timeout = 0 if seen.problems else self.timeout
        if isinstance(step, Reconnect):  # a backend's connect_sockets: no call a batch makes
            try:
                self._reconnect(step, closes)
                result: object = None
            except Exception as exc:  # judged as any call's answer
                result = exc
            return Made(result, {}, None)
        new_op = step.op if isinstance(step, Transfer) else None
        checked = self.checked(exp, full=self.full, known=set(self.ops) | ({new_op} if new_op is not None else set()))
        with batch(self.world.backend) as b:
            try:
                answer = self._call(b, step)
            except Exception as exc:  # an argument the backend refused as it was made (judged as the answer)
                return Made(exc, {}, None)
            waits: dict[int, Later[Completion]] = {}
            for op_id in exp.done:
                if op_id == new_op:
                    waits[op_id] = b.call(wait_for, answer.ref, timeout)
                elif op_id in self.ops:
                    waits[op_id] = b.call(wait_for, self.ops[op_id], timeout, answer.ref)
            b.barrier()
            ops: dict[int, Any] = {**self.ops, **({new_op: answer.ref} if new_op is not None else {})}
            looks = self.looks(b, checked, ops)
        if answer.error is None:
            return Made(answer.value, waits, (checked, looks))
        # Refused: no wait was made, and what the model then expects is waited for one by one; the reads stand
        # only if nothing was to complete (else they may be older than a completion still to come).
        return Made(answer.error, {}, None if waits else (checked, looks))

    def catch_up(self) -> Seen | None:
        """Where a backend may end a waiting send on its own (``send-wait-bounded``), see whether it did, and
        move the model on as it did: one look at every send waiting for a receive, together."""
        model = self.model
        assert model is not None
        if RNR_BOUNDED not in self.traits.alts:
            return None
        seen = None
        old = self._old_waiting_sends(model)
        ended = self._gave_up(op for _, op in old)
        for sock, op in old:
            if op in ended:
                gave_up = Seen(model.gave_up(sock))
                self._completions(gave_up)
                seen = _merged(seen or Seen(Expect()), gave_up)
        return seen

    def _old_waiting_sends(self, model: Model) -> list[tuple[int, int]]:
        if RNR_BOUNDED not in self.traits.alts:
            return []
        now = time.monotonic()
        return [(sock, op) for sock, op in model.waiting_sends()
                if op in self.ops and now - self.posted.get(op, now) > GIVE_UP_AFTER]

    def _gave_up_meanwhile(self, model: Model) -> bool:
        return bool(self._gave_up(op for _, op in self._old_waiting_sends(model)))

    def _gave_up(self, ops: Iterable[int]) -> set[int]:
        """Which of the waiting sends ``ops`` ended on their own (asked together): done, and not delivered. A send
        the step itself let complete (a receive the peer posted) is done too, and the model delivers it: it did
        not give up."""
        with batch(self.world.backend) as b:
            looks = [(op, b.call(wait_for, self.ops[op], 0)) for op in ops]
        return {op for op, look in looks if look.error is None and look.value.status != Status.SUCCESS}

    def _settled_check(self, seen: Seen, *, full: bool, looked: Looked | None = None) -> None:
        """The checks (on what the step's batch ``looked`` at, if it covers them: if those differ from the model,
        on reads of their own); if they fail while a send gave up waiting after the call, again once the model
        knows."""
        before = len(seen.problems)
        self.check(seen, full=full, looked=looked)
        if looked is not None and len(seen.problems) > before:
            # rxe shows an error completion before its QP's state has changed (the CQE is posted, then the QP
            # moved to ERR): reads sent with the wait that saw it may be older than that. Reads of their own, a
            # round trip later as before issue 29, decide.
            del seen.problems[before:]
            self.check(seen, full=full)
        assert self.model is not None
        if len(seen.problems) > before and RNR_BOUNDED in self.traits.alts and self._gave_up_meanwhile(self.model):
            del seen.problems[before:]
            _merged(seen, self.catch_up())
            self.check(seen, full=full)

    def _call(self, b: Batch, step: Step) -> Later[Any]:
        """The step's call (every kind but ``Reconnect``), added to ``b``."""
        model, world = self.model, self.world
        assert model is not None
        if isinstance(step, Register):
            access: Any = Access(step.access) if step.access in VALID_ACCESS else step.access
            provider, sock = self._provider(step.sock), self.socks[step.sock]
            buffer = world.buffer(step.view, step.shape)
            if step.kind == "memory":
                return b.call(provider.register_memory, sock, buffer, access)
            return b.call(provider.register_rdma_memory, sock, buffer, access, step.size)
        if isinstance(step, Deregister):
            provider, sock = self._provider(step.sock), self.socks[step.sock]
            value: Any = model.value(step.key)
            if step.kind == "memory":
                return b.call(provider.deregister_memory, sock, value)
            return b.call(provider.deregister_rdma_memory, sock, value)
        if isinstance(step, Transfer):
            provider, sock = self._provider(step.sock), self.socks[step.sock]
            # Whatever the step names goes to the provider as it is: a junk key or descriptor is the point.
            entries: Any = [(world.buffer(view), model.value(key)) for view, key in step.entries]
            desc: Any = model.value(step.desc)
            if step.kind == "rdma_write":
                return b.call(provider.rdma_write, sock, entries, desc, step.offset)
            if step.kind == "rdma_read":
                return b.call(provider.rdma_read, sock, entries, desc, step.offset)
            return b.call(provider.send if step.kind == "send" else provider.recv, sock, entries)
        if isinstance(step, Scribble):
            pi, bi, off, n = step.view
            return b.call(world.bufs[pi][bi].write, pattern(step.seed, n), off)
        if isinstance(step, Getsockopt):
            s = model.socks[step.sock]
            via = s.peer.id if step.foreign and s.peer is not None else step.sock
            option: Any = step.option  # a junk option is the point
            return b.call(self._provider(via).getsockopt, self.socks[step.sock], option)
        assert isinstance(step, Close)
        return b.call(self._provider(step.sock).close_socket, self.socks[step.sock])

    def _reconnect(self, step: Reconnect, closes: list[int]) -> None:
        for sock_id in closes:
            self._provider(sock_id).close_socket(self.socks[sock_id])
        self._connect(step.slot, step.socks)

    def _judge_answer(self, step: Step, seen: Seen, result: object,
                      waits: Mapping[int, Later[Completion]] | None = None) -> None:
        """``result``: what the call returned or raised; then the completions the model expects, as ``waits``
        (the step's batch) saw them, or waited for here."""
        exp = seen.expect
        seen.call = _outcome(step, result)
        assert self.model is not None
        allowed = frozenset().union(*exp.instead.values())
        self.model.answered(exp, result)  # a refusal the step allowed instead: the model goes back, exp expects it
        if exp.raises:
            if not (isinstance(result, SanError) and result.code.name in exp.raises):
                seen.problem("call", f"answered {seen.call}, expected {' or '.join(sorted(exp.raises))}")
        elif isinstance(result, BaseException):
            category = "call" if isinstance(result, SanError | TypeError | ValueError) else "crash"
            instead = f" (or {' or '.join(sorted(allowed))} at the call)" if allowed else ""
            seen.problem(category, f"answered {seen.call}, expected {_RETURNS[exp.returns]}{instead}")
        elif isinstance(step, Register):
            self._key(step, seen, result)
        elif isinstance(step, Transfer):
            self.ops[step.op] = cast(PendingOperation, result)  # what it returned: waiting for it judges it
            self.posted.setdefault(step.op, time.monotonic())
        elif isinstance(step, Getsockopt) and (type(result) is not int or result < 0):
            seen.problem("call", f"getsockopt returned {result!r:.40}, not a non-negative integer")
        self._completions(seen, waits)

    def _key(self, step: Register, seen: Seen, key: object) -> None:
        model = self.model
        assert model is not None
        call = "register_memory" if step.kind == "memory" else "register_rdma_memory"
        why = not_a_key(step.kind, key, model.traits.desc_size)
        if why:
            seen.problem("key", f"{call} returned {key!r:.80}, {why}")
            return
        value: KeyValue = key
        sock = model.socks[step.sock]
        if step.kind == "rdma" and value in sock.released:  # a stale copy of it would reach this registration's memory
            seen.problem("key", f"{call} returned {value!r}, a descriptor deregistered on this connection before "
                                "(R3: never handed out again on it)")
            return
        mine = (step.kind, step.view, step.access)
        clash = [r for r in sock.regs.values() if r.kind == step.kind and r.key == value and r.key is not None
                 and (r.kind, r.view, r.access) != mine]
        if clash:  # a key may name the same range again (R13), never another live registration
            seen.problem("key", f"returned {value!r}, already the key of another live registration")
            return
        model.bind(step, value)

    def _completions(self, seen: Seen, waits: Mapping[int, Later[Completion]] | None = None) -> None:
        """Each completion the model expects, as ``waits`` saw it, else waited for now."""
        for op_id, (statuses, nbytes) in seen.expect.done.items():
            op = self.ops.pop(op_id, None)
            if op is None:
                continue  # its call did not return an operation: a problem already
            self._popped[op_id] = op
            want = " or ".join(sorted(s.name for s in statuses)) + (f" {nbytes} bytes" if nbytes else "")
            try:  # once the step went wrong, what has not completed is only reported, not waited for
                waited = waits.get(op_id) if waits is not None else None
                done = waited.value if waited is not None else op.wait(0 if seen.problems else self.timeout)
            except Exception as exc:
                seen.done[op_id] = "still pending" if isinstance(exc, TimeoutError) else repr(exc)
                seen.problem("completion", f"operation of step op#{op_id}: {seen.done[op_id]}, expected {want}")
                continue
            seen.done[op_id] = done.status.name + (f" {done.bytes} bytes" if done.bytes else "")
            if done.status not in statuses or done.bytes != nbytes:
                seen.problem("completion", f"operation op#{op_id}: {seen.done[op_id]}, expected {want}")

    # -- checks --------------------------------------------------------------------------------

    def checked(self, exp: Expect, *, full: bool, model: Model | None = None, known: set[int] | None = None) -> Checked:
        """What a check after a step with expectation ``exp`` compares (all of it with ``full``), in ``model``
        (default: the side's), of the operations ``known`` (default: those the side holds)."""
        model = model or self.model
        assert model is not None
        known = set(self.ops) if known is None else known
        touched = exp.touched
        everyone = list(model.socks)
        waiting = {op for _, op in model.waiting_sends()} if not full else set()  # catch_up asks about those
        return Checked(
            registrations=everyone if full else sorted(touched.registrations),
            nodes=list(range(len(self.world.nodes))) if full else sorted(touched.nodes),
            buffers=sorted(model.data) if full else sorted(touched.buffers),
            states=everyone if full else sorted(touched.states),
            pending=[op_id for op_id, mop in sorted(model.ops.items())
                     if (full or (mop.sock.id in touched.pending and op_id not in waiting)) and op_id in known])

    def looks(self, b: Batch, checked: Checked, ops: Mapping[int, Any] | None = None) -> dict[Asked, Later[Any]]:
        """What a check reads, added to ``b``, each by its key (``Asked``); ``ops``: the operations by id (default:
        those the side holds; in a step's batch, the step's own as its call's ``Later.ref``)."""
        ops = self.ops if ops is None else ops
        looks: dict[Asked, Later[Any]] = {}
        for s in checked.registrations:
            looks["registrations", s] = b.call(self._provider(s).registrations, self.socks[s])
        for n in checked.nodes:
            looks["live", n] = b.call(self.world.nodes[n].proxy.live_allocations)
        for pi, bi in checked.buffers:
            looks["bytes", pi, bi] = b.call(self.world.bufs[pi][bi].read)
        # An operation before the states: its error completion moves its socket to error, so read after it a state
        # cannot be older than a completion seen in the same look. Its completion only once it is done (a look,
        # not a wait): TimeoutError while it is pending.
        for op in checked.pending:
            looks["pending", op] = b.call(wait_for, ops[op], 0)
        for s in checked.states:
            looks["connected", s] = b.call(is_connected, self.socks[s])
            looks["closed", s] = b.call(is_closed, self.socks[s])
        return looks

    def check(self, seen: Seen, *, full: bool, looked: Looked | None = None) -> None:
        """Compare the backend's state with the model's, every read of it made together (a lab: one round trip
        per host), or read already (``looked``: a step's batch read what the model expected to check; used when
        it covers what the model, having judged the answer, checks)."""
        checked = self.checked(seen.expect, full=full)
        if looked is not None and _covers(looked[0], checked):
            looks = looked[1]
        else:
            with batch(self.world.backend) as b:
                looks = self.looks(b, checked)
        self._check_state(seen, checked, full, lambda key: looks[key].value)

    def _check_state(self, seen: Seen, checked: Checked, full: bool, ask: Callable[[Asked], Any]) -> None:
        """The backend's state (``checked``, as ``ask`` answers it) held to the model's: each difference is a
        problem of ``seen``."""
        model = self.model
        assert model is not None
        for sock_id in checked.registrations:
            self._registrations(seen, sock_id, ask)
        for node in checked.nodes:
            try:
                live = ask(("live", node))
            except Exception as exc:  # whatever a provider answers, the model reports it, never fails itself
                seen.problem("proxy", f"proxy of node {node}: asking it raised {exc!r}")
                continue
            low, high = model.live_registrations(node)
            base = self.world.baseline[node]
            if not base + low <= live <= base + high:
                want = f"{base + low}" if low == high else f"{base + low} to {base + high}"
                seen.problem("proxy", f"proxy of node {node}: {live!r} live allocations, the model has {want} "
                                      "(R12: at least one per live registration, at most one per register call "
                                      "it answered)")
        for pi, bi in checked.buffers:
            self._bytes(seen, pi, bi, ask)
        for sock_id in checked.states:
            self._state(seen, sock_id, ask, closed_too=full or model.socks[sock_id].state == "closed")
        for op_id in checked.pending:
            mop = model.ops[op_id]
            try:
                completion = ask(("pending", op_id))
            except TimeoutError:
                continue  # still pending, as the model holds it
            except Exception as exc:
                seen.problem("pending", f"op#{op_id} ({mop.kind} on s{mop.sock.id}): asking it raised {exc!r}")
                continue
            seen.problem("pending", f"op#{op_id} ({mop.kind} on s{mop.sock.id}) completed {completion}, the model "
                                    "holds it pending")

    def _registrations(self, seen: Seen, sock_id: int, ask: Callable[[Asked], Any]) -> None:
        model = self.model
        assert model is not None
        msock = model.socks[sock_id]
        try:
            regs = ask(("registrations", sock_id))
            real = _references((r.kind, r.address, r.length, int(r.access), r.refs) for r in regs)
        except SanError as exc:  # a closed socket holds nothing, whichever way the provider says so
            if msock.state != "closed":
                seen.problem("registrations", f"registrations(s{sock_id}) raised {exc!r}")
            return
        except Exception as exc:
            seen.problem("registrations", f"registrations(s{sock_id}) raised or returned junk: {exc!r}")
            return
        want = _references((r.kind, self._address(r.view), r.view[3], r.access, r.refs) for r in msock.regs.values())
        if real != want:
            seen.problem("registrations", f"registrations of s{sock_id}: the provider has {real}, the model {want}")

    def _address(self, view: View) -> int:
        return int(self.world.bufs[view[0]][view[1]].address) + view[2]

    def _bytes(self, seen: Seen, pi: int, bi: int, ask: Callable[[Asked], Any]) -> None:
        assert self.model is not None
        want = bytes(self.model.data[pi, bi])
        real = ask(("bytes", pi, bi))
        if real != want:
            diff = [i for i in range(len(want)) if i >= len(real) or real[i] != want[i]]
            seen.problem("bytes", f"p{pi}/b{bi}: bytes {diff} differ from the model: {real.hex()} != {want.hex()}")

    def _state(self, seen: Seen, sock_id: int, ask: Callable[[Asked], Any], *, closed_too: bool) -> None:
        assert self.model is not None
        state = self.model.socks[sock_id].state
        if state == "closed" and not self.full:  # a closed socket: only whether it is closed
            if not ask(("closed", sock_id)):
                seen.problem("state", f"s{sock_id}: closed=False, the model says closed")
            return
        if ask(("connected", sock_id)) != (state == "connected"):
            seen.problem("state", f"s{sock_id}: connected={state != 'connected'}, the model says {state}")
        if closed_too and ask(("closed", sock_id)) != (state == "closed"):
            seen.problem("state", f"s{sock_id}: closed={state != 'closed'}, the model says {state}")

    # -- the end of a sequence -------------------------------------------------------------------

    def finish(self) -> Seen:
        """Check everything, close every open socket, check that nothing is left (R11)."""
        model = self.model
        assert model is not None
        t0 = time.perf_counter()
        seen = self.catch_up() or Seen(Expect())
        if not self.full and not seen.problems:  # what no step looked at: each open socket's registrations, state
            opened = {s.id for s in model.open_sockets()}
            seen.expect.touched = Touched(registrations=opened, states=opened,
                                          nodes=set(range(len(self.world.nodes))))
            self._settled_check(seen, full=False)
        closes = model.close_all()
        # Remote: backend.leaks() lists every registration and proxy allocation left, so no proxy is asked.
        last = Seen(Expect(touched=Touched(buffers=set(model.data),
                                           nodes=set(range(len(self.world.nodes))) if self.full else set())))
        checked = self.checked(last.expect, full=self.full)
        with batch(self.world.backend) as b:  # the closes, then (behind a barrier) what the last check reads
            closing = self._closes(b, closes)
            b.barrier()
            looks = self.looks(b, checked)
        for sock_id, exp, closed, waits in closing:
            seen.problems += self.closed(sock_id, exp, closed.error, waits if closed.error is None else None).problems
        if not seen.problems:
            seen.expect.touched = last.expect.touched
            self.check(seen, full=self.full, looked=(checked, looks))
            leaks = [str(leak) for leak in self.world.backend.leaks()]
            if leaks:
                seen.problem("leaks", "still alive after every socket was closed (R11): " + "; ".join(leaks))
        if not seen.problems:
            self.world.data = {key: bytes(value) for key, value in model.data.items()}
        self.cost.finish += time.perf_counter() - t0
        return seen

    def _closes(self, b: Batch, closes: list[tuple[int, Expect]]) -> list[Closing]:
        """Each close in turn, added to ``b`` with the waits for the completions the model expects of it (made
        only if it returned); a barrier wherever the next close is on another node, so none overtakes one before
        it (``Model.close_all`` closes node by node)."""
        made: list[Closing] = []
        for sock_id, exp in closes:
            if made and self.nodes_of[made[-1][0]] != self.nodes_of[sock_id]:
                b.barrier()
            closed = b.call(self._provider(sock_id).close_socket, self.socks[sock_id])
            waits = {op: b.call(wait_for, self.ops[op], self.timeout, closed.ref) for op in exp.done if op in self.ops}
            made.append((sock_id, exp, closed, waits))
        return made

    def closed(self, sock_id: int, exp: Expect, error: BaseException | None,
               waits: Mapping[int, Later[Completion]] | None = None) -> Seen:
        """The close of ``sock_id`` judged: the exception ``close_socket`` raised (None: it returned), then its
        completions (as ``waits`` saw them, else waited for now)."""
        closing = Seen(exp)
        if error is not None:
            closing.problem("call", f"close_socket(s{sock_id}) raised {error!r}")
        self._completions(closing, waits)
        return closing

    def abandon(self) -> bool:
        """After a divergence: close whatever is open. False: something is left (reset the backend)."""
        for sock_id, sock in self.socks.items():
            try:
                if not sock.closed:
                    self._provider(sock_id).close_socket(sock)
            except Exception:  # best effort: the backend is reset if anything is left
                continue
        try:
            return not self.world.backend.leaks()
        except Exception:
            return False


def _references(regs: Iterable[tuple[str, int, int, int, int]]) -> list[tuple[str, int, int, int, int]]:
    """(kind, address, length, access, references) per distinct range: one registration of two references and
    two of one each are the same to R13 (a provider may answer a second registration with a new key)."""
    total: collections.Counter[tuple[str, int, int, int]] = collections.Counter()
    for kind, address, length, access, refs in regs:
        total[kind, address, length, access] += refs
    return sorted((*key, refs) for key, refs in total.items())

