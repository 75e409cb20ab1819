"""Refusals the contract lets a provider make at the call instead of by an error completion (docs/model.md,
"Documented alternatives": ``refused-at-the-call`` and ``rdma-read-one-buffer``).

"Rejected" is a SanError at the call or an error completion, no byte moving either way (CONTRACT.md section 2),
and a call refused changes nothing (section 4). So the model takes either answer to a transfer with a bad scatter
entry, and to a read into several buffers where the provider lacks ``rdma_read_scatter``, on every backend; a
refusal after something moved or changed, or of a transfer the contract lets through, still diverges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_san import Access
from pytest_san.model import alternatives
from pytest_san.model.reference import Model
from pytest_san.model.run import ModelRun, Summary
from pytest_san.model.state import Traits
from pytest_san.model.steps import Key, Register, Transfer, plan_for
from pytest_san.mutants.wrapping import DelegatingProvider, Shared, entries
from pytest_san.spi.contract import MAX_SGE, SanError, Status, WsaError
from pytest_san.spi.emulator import EmulatorBackend
from pytest_san.spi.protocols import Buffer, ModelBudget, Node
from tests.support.held_out_providers.single_entry_rdma_read import SingleEntryRdmaRead

REFUSED = alternatives.REFUSED_AT_CALL
ONE_BUFFER = alternatives.READ_ONE_BUFFER
EVERY = alternatives.active(set())  # what a backend without any capability takes: both of them


def _quiet(_: str) -> None:
    pass


# -- the model's expectation ---------------------------------------------------------------------------

def _model(alts: frozenset[str] = EVERY, *, reference_order: bool = False) -> Model:
    """Slot 0 (sockets 0 and 1: processes 0 and 2): handle#1 READWRITE over p0/b0[0:64], handle#2 READ over
    p0/b1[0:40], handle#3 over p2/b0 on socket 1, descriptor#4 READWRITE over p2/b1 on socket 1; socket 1 has
    a receive pending (op 9)."""
    model = Model(plan_for(2), Traits(alts=alts, desc_size=20, reference_order=reference_order))
    for step, key in ((Register(0, "memory", (0, 0, 0, 64), 3, reg=1), 0x11),
                      (Register(0, "memory", (0, 1, 0, 40), int(Access.READ), reg=2), 0x12),
                      (Register(1, "memory", (2, 0, 0, 64), 3, reg=3), 0x21),
                      (Register(1, "rdma", (2, 1, 0, 40), 3, reg=4), b"\4" * 20)):
        model.apply(step)
        model.bind(step, key)
    assert model.apply(Transfer(1, "recv", (((2, 0, 0, 16), Key(reg=3)),), op=9)).returns == "op"
    return model


BAD_ENTRIES = {  # what makes an entry of socket 0 one the provider refuses, as (view, key)
    "a handle unknown on the socket": ((0, 0, 0, 8), Key(junk=0x7777)),
    "another socket's handle": ((0, 0, 0, 8), Key(reg=3)),
    "a range outside the registration": ((0, 0, 60, 8), Key(reg=1)),
    "another buffer than the registration's": ((0, 1, 0, 8), Key(reg=1)),
}


def _transfer(kind: str, bad: tuple[Any, Key], where: int, op: int = 5) -> Transfer:
    good = ((0, 0, 16, 8), Key(reg=1))
    listed = [good, good, good]
    listed.insert(where, bad)
    desc = Key(reg=4) if kind.startswith("rdma") else None
    return Transfer(0, kind, tuple(listed), op=op, desc=desc)


@pytest.mark.parametrize("kind", ["send", "recv", "rdma_write", "rdma_read"])
@pytest.mark.parametrize("bad", sorted(BAD_ENTRIES))
@pytest.mark.parametrize("where", [0, 2, 3])
def test_a_bad_entry_anywhere_may_be_refused_at_the_call_instead_of_completing(kind: str, bad: str,
                                                                                where: int) -> None:
    exp = _model().apply(_transfer(kind, BAD_ENTRIES[bad], where))
    assert exp.returns == "op" and exp.done[5] == (frozenset({Status.LOCAL_PROTECTION}), 0)
    assert exp.instead[REFUSED] == {"WSAEFAULT", "WSAEINVAL"}


def test_an_entry_of_the_wrong_access_may_be_refused_at_the_call() -> None:
    read_only_sink = ((0, 1, 0, 8), Key(reg=2))
    for kind in ("recv", "rdma_read"):
        assert _model().apply(_transfer(kind, read_only_sink, 1)).instead[REFUSED] == {"WSAEFAULT", "WSAEINVAL"}
    assert not _model().apply(_transfer("send", read_only_sink, 1)).instead  # READ is what a source needs


def test_a_good_transfer_may_not_be_refused() -> None:
    good = ((0, 0, 16, 8), Key(reg=1))
    for kind in ("send", "recv", "rdma_write"):
        exp = _model().apply(_transfer(kind, good, 0))
        assert exp.returns == "op" and not exp.instead, kind


def test_a_refusal_at_the_call_leaves_the_model_as_before_the_call() -> None:
    """The completion path breaks the connection and flushes the peer's receive; the refusal at the call changes
    nothing (CONTRACT.md section 4), so the model goes back: the receive is still pending, both ends connected."""
    model = _model()
    exp = model.apply(_transfer("send", BAD_ENTRIES["a range outside the registration"], 1))
    assert (model.socks[0].state, model.socks[1].state) != ("connected", "connected") and 9 in exp.done
    assert model.answered(exp, SanError(WsaError.WSAEFAULT, "bad entry"))
    assert (model.socks[0].state, model.socks[1].state) == ("connected", "connected")
    assert 9 in model.ops and exp.done == {} and exp.raises == {"WSAEFAULT"} and REFUSED in exp.alternatives
    # ... and what comes after is judged from there: a good send is delivered into the pending receive.
    then = model.apply(Transfer(0, "send", (((0, 0, 16, 8), Key(reg=1)),), op=6))
    assert then.done == {9: (frozenset({Status.SUCCESS}), 8), 6: (frozenset({Status.SUCCESS}), 8)}


@pytest.mark.parametrize("answer", [
    pytest.param(SanError(WsaError.WSAENOTCONN, "not that code"), id="another-code"),
    pytest.param(None, id="it-returned")])
def test_any_other_answer_keeps_the_completion_path(answer: object) -> None:
    model = _model()
    exp = model.apply(_transfer("recv", BAD_ENTRIES["another socket's handle"], 0))
    assert not model.answered(exp, answer)
    assert model.socks[0].state == "error" and exp.done[5] == (frozenset({Status.LOCAL_PROTECTION}), 0)
    assert not exp.raises and REFUSED not in exp.alternatives


def test_the_alternative_is_not_taken_where_it_is_not_active() -> None:
    """The differential mode's emulator (no alternatives) keeps the one answer: an error completion."""
    exp = _model(frozenset()).apply(_transfer("send", BAD_ENTRIES["a handle unknown on the socket"], 0))
    assert exp.returns == "op" and not exp.instead


# -- rdma-read-one-buffer ------------------------------------------------------------------------------

def _read(model: Model, count: int) -> Transfer:
    return Transfer(0, "rdma_read", tuple(((0, 0, 8 * i, 8), Key(reg=1)) for i in range(count)), op=5,
                    desc=Key(reg=4))


def test_without_rdma_read_scatter_a_read_into_several_buffers_may_be_refused() -> None:
    model = _model()
    exp = model.apply(_read(model, 2))
    assert exp.returns == "op" and exp.done[5] == (frozenset({Status.SUCCESS}), 16)
    assert exp.instead == {ONE_BUFFER: {"WSAEINVAL"}}
    assert model.answered(exp, SanError(WsaError.WSAEINVAL, "one buffer"))
    assert exp.done == {} and ONE_BUFFER in exp.alternatives and model.data[0, 0] == _model().data[0, 0]
    assert not _model().apply(_read(model, 1)).instead
    scatter = alternatives.active({"rdma_read_scatter"})
    assert ONE_BUFFER not in scatter and not _model(scatter).apply(_read(model, 2)).instead


def test_in_the_reference_order_a_read_into_several_buffers_is_the_device_check() -> None:
    exp = _model(reference_order=True).apply(_read(_model(), 2))
    assert exp.raises == {"WSAEINVAL"} and ONE_BUFFER in exp.alternatives


def test_with_another_fault_the_device_check_is_one_more_answer() -> None:
    """A read into several buffers, one of them another process's: the provider may answer either fault."""
    model = _model()
    step = Transfer(0, "rdma_read", (((0, 0, 0, 8), Key(reg=1)), ((1, 0, 0, 8), Key(reg=1))), op=5, desc=Key(reg=4))
    assert model.apply(step).raises == {"WSAEFAULT", "WSAEINVAL"}


# -- providers that refuse at the call, on the emulator ------------------------------------------------

class RefusesBadEntriesAtTheCall(DelegatingProvider):
    """Every scatter entry the emulator would complete LOCAL_PROTECTION is refused at the call instead:
    WSAEINVAL for a handle not registered on the socket, WSAEFAULT for a range or access its handle does not
    allow. What is wrong with the call itself is the wrapped provider's to answer."""

    def refuse(self, socket: Any, buffers: Any, need: Access) -> SanError | None:
        pairs = list(entries(buffers))
        if not socket.connected or len(pairs) != len(buffers) or len(pairs) > MAX_SGE:
            return None
        if not all(isinstance(b, Buffer) and b.process is socket.process for b, _ in pairs):
            return None  # another process's buffer: the call's own fault (WSAEFAULT)
        for i, (buffer, handle) in enumerate(pairs):
            reg = self.shared.registered.get((id(socket), handle))
            if reg is None or reg.kind != "memory":
                return SanError(WsaError.WSAEINVAL, f"local_buffers[{i}]: no such handle on the socket")
            base, size = reg.buffer.address, reg.buffer.length
            if not reg.access & need or buffer.address < base or buffer.address + buffer.length > base + size:
                return SanError(WsaError.WSAEFAULT, f"local_buffers[{i}] is not {need.name} memory of its handle")
        return None

    def check(self, socket: Any, buffers: Any, need: Access, descriptor: Any = None) -> None:
        if descriptor is not None and (not isinstance(descriptor, bytes | bytearray) or len(descriptor) != 20):
            return  # a descriptor of the wrong length: the wrapped provider answers (WSAEINVAL)
        refused = self.refuse(socket, buffers, need)
        if refused is not None:
            raise refused

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        self.check(socket, local_buffers, Access.READ, target_descriptor)
        return super().rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        self.check(socket, local_buffers, Access.WRITE, source_descriptor)
        return super().rdma_read(socket, local_buffers, source_descriptor, offset)

    def send(self, socket: Any, buffers: Any) -> Any:
        self.check(socket, buffers, Access.READ)
        return super().send(socket, buffers)

    def recv(self, socket: Any, buffers: Any) -> Any:
        self.check(socket, buffers, Access.WRITE)
        return super().recv(socket, buffers)


class MovesBytesThenRefuses(RefusesBadEntriesAtTheCall):
    """A bug: an RDMA write with a bad entry sends its good entries first, then raises WSAEFAULT."""

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        refused = self.refuse(socket, local_buffers, Access.READ)
        if refused is not None and isinstance(target_descriptor, bytes) and len(target_descriptor) == 20:
            good = [pair for pair in local_buffers if self.refuse(socket, [pair], Access.READ) is None]
            self.inner.rdma_write(socket, good, target_descriptor, offset).wait(2.0)
            raise refused
        return super().rdma_write(socket, local_buffers, target_descriptor, offset)


class BreaksThenRefuses(RefusesBadEntriesAtTheCall):
    """A bug: a bad entry is posted (its error completion breaks the connection), then the call raises."""

    def check(self, socket: Any, buffers: Any, need: Access, descriptor: Any = None) -> None:
        refused = self.refuse(socket, buffers, need)
        if refused is not None and descriptor is None:
            operation = (self.inner.send if need == Access.READ else self.inner.recv)(socket, buffers)
            operation.wait(2.0)
            raise refused


class RefusesEveryList(RefusesBadEntriesAtTheCall):
    """A bug: any send of more than one entry is refused at the call, good or not."""

    def send(self, socket: Any, buffers: Any) -> Any:
        if socket.connected and isinstance(buffers, list) and len(buffers) > 1:
            raise SanError(WsaError.WSAEFAULT, "too many")
        return super().send(socket, buffers)


def _run(wrapper: Callable[[Any, Node, Shared], Any], *, sequences: int = 40, seed: int = 7,
         drop: frozenset[str] = frozenset()) -> Summary:
    """The model on the emulator whose every provider is ``wrapper``'s, with the capabilities a plugin's provider
    has (the backend's, but ``reference_order`` and ``drop``); the regressions first, as every run does."""
    shared = Shared()

    def wrap(node: Any, provider: Any) -> Any:
        return wrapper(provider, node, shared)

    made = EmulatorBackend(wrap_provider=wrap)
    caps = made.capabilities - {"reference_order"} - drop
    return ModelRun(made, ModelBudget(sequences=sequences, steps=40, seed=seed), log=_quiet,
                    capabilities={node.name: caps for node in made.nodes}).run()


def test_a_provider_that_refuses_every_bad_entry_at_the_call_passes_the_model() -> None:
    summary = _run(RefusesBadEntriesAtTheCall)
    assert summary.divergences == [], [d.render() for d in summary.divergences]
    assert summary.alternatives[REFUSED] > 10  # it did refuse at the call, again and again


@pytest.mark.parametrize(("bug", "category"), [
    pytest.param(MovesBytesThenRefuses, "bytes", id="moves-bytes-then-refuses"),
    pytest.param(BreaksThenRefuses, "state", id="breaks-the-connection-then-refuses"),
    pytest.param(RefusesEveryList, "call", id="refuses-a-good-list")])
def test_a_refusal_at_the_call_that_is_not_one_diverges(bug: Callable[[Any, Node, Shared], Any],
                                                        category: str) -> None:
    summary = _run(bug, sequences=100)
    found = {d.problem.category for d in summary.divergences}
    assert category in found, [d.render() for d in summary.divergences]


def test_a_provider_whose_reads_land_in_one_buffer_passes_the_model() -> None:
    """Held-out legal variant ``single_entry_rdma_read`` (no ``rdma_read_scatter``), on the emulator: no
    backend name selects the alternative, the missing capability does."""
    summary = _run(SingleEntryRdmaRead, drop=frozenset({"rdma_read_scatter"}))
    assert summary.divergences == [], [d.render() for d in summary.divergences]
    assert summary.alternatives[ONE_BUFFER] > 0


def test_the_rules_of_a_divergence_follow_the_refusals_the_backend_made() -> None:
    """A divergence's rules are judged on the steps replayed on a fresh model (rules.py): a transfer the backend
    refused at the call left its connection up there too, so a later write into a READ window breaks R6 alone
    (replayed as an error completion, the connection would be down: R4 as well)."""
    from pytest_san.model.execute import Problem
    from pytest_san.model.rules import broken_rules

    steps = [Register(0, "memory", (0, 0, 0, 64), int(Access.READ), reg=1),
             Register(1, "rdma", (2, 1, 0, 40), int(Access.READ), reg=2),
             Transfer(0, "send", (((0, 0, 60, 8), Key(reg=1)),), op=5),  # outside its registration
             Transfer(0, "rdma_write", (((0, 0, 0, 8), Key(reg=1)),), op=6, desc=Key(reg=2))]
    problem = Problem("completion", "operation op#6: SUCCESS 8 bytes, expected ACCESS_VIOLATION")
    keys = {1: 0x11, 2: b"\2" * 20}

    def fresh(refused: dict[int, str]) -> Callable[[], Model]:
        def made() -> Model:
            model = Model(plan_for(2), Traits(alts=EVERY, desc_size=20))
            model.refused_at_call = dict(refused)
            return model
        return made

    assert broken_rules(problem, steps, 3, fresh({5: "WSAEFAULT"}), keys) == ("R6",)
    assert broken_rules(problem, steps, 3, fresh({}), keys) == ("R4", "R6")
