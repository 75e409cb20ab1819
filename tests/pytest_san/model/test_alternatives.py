"""The documented alternatives: docs/model.md's table is the code's, and each applies exactly where it says."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_san.model import alternatives
from pytest_san.model.run import ModelRun
from pytest_san.model.state import Traits
from pytest_san.spi.emulator import EmulatorBackend
from pytest_san.spi.protocols import ModelBudget

MODEL_PAGE = Path(__file__).resolve().parents[3] / "docs" / "model.md"
MODEL = Path(alternatives.__file__).parent


def _quiet(_: str) -> None:
    pass


def test_the_docs_list_exactly_the_alternatives_of_the_code() -> None:
    lines = MODEL_PAGE.read_text(encoding="utf-8").splitlines()
    table = alternatives.markdown_table()
    starts = [i for i, line in enumerate(lines) if line == table[0]]
    assert len(starts) == 1, "docs/model.md must hold the table of alternatives once (alternatives.markdown_table())"
    start = starts[0]
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert rows == table, "docs/model.md's table of alternatives differs from pytest_san/model/alternatives.py"


def test_every_alternative_is_used_by_the_model() -> None:
    source = "".join(path.read_text(encoding="utf-8") for path in sorted(MODEL.glob("*.py"))
                     if path.name != "alternatives.py")
    names = {value: name for name, value in vars(alternatives).items() if isinstance(value, str) and name.isupper()}
    for alt in alternatives.ALTERNATIVES:
        assert re.search(rf"\balt\.{names[alt.id]}\b", source), f"{alt.id} is documented but the model never uses it"


def test_alternatives_follow_the_capability() -> None:
    a = alternatives
    everything = {alt.id for alt in a.ALTERNATIVES}
    assert a.active({"verbs", "rdma_read"}) == everything - {a.ERROR_ENDS_CONNECTION, a.STATED_FIRST}
    rxe = {"verbs", "rdma_read", "send_waits", "rdma_read_scatter", "memory_windows"}
    assert a.active(rxe) == everything - {a.ERROR_ENDS_CONNECTION, a.READ_ONE_BUFFER, a.STATED_FIRST}
    siw = {"verbs", "rdma_read", "iwarp"}  # what a siw host declares (max_sge_rd 1, no RNR)
    assert a.active(siw) == {a.LKEY_STATUS, a.SHORT_RECEIVE, a.ZERO_RDMA, a.READ_ONE_BUFFER,
                             a.ERROR_ENDS_CONNECTION, a.STATED_FIRST, a.REFUSED_AT_CALL}
    assert a.active({"iwarp", "rdma_read", "rdma_read_scatter"}) == {a.ERROR_ENDS_CONNECTION, a.STATED_FIRST,
                                                                     a.REFUSED_AT_CALL}
    # Every backend may meet a provider that refuses a bad entry at the call; the emulator's reads scatter.
    assert alternatives.active(EmulatorBackend().capabilities) == {a.REFUSED_AT_CALL}
    emulator_agents = {"hil", "rdma_read", "rdma_read_scatter"}  # emulator-engine agents answer as in-process
    assert alternatives.active(emulator_agents) == {a.REFUSED_AT_CALL}
    # Capabilities, never backend names: a provider whose reads do not scatter, on any backend.
    for backend in ({"emulator", "rdma_read"}, {"hil", "rdma_read"}, set()):
        assert a.active(backend) == {a.READ_ONE_BUFFER, a.REFUSED_AT_CALL}


VERBS = ModelBudget(sequences=30, steps=40, seed=4, avoid_slow_steps=True)
"""A verbs backend's draws: the steps that cost seconds on a NIC are avoided (as the hil backend's budget says)."""


class _ClaimsVerbs:
    """The emulator under a backend that says it drives verbs: the model then expects the verbs answers."""

    def __init__(self, base: EmulatorBackend) -> None:
        self._base = base

    @property
    def capabilities(self) -> frozenset[str]:
        return self._base.capabilities | {"verbs"}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def _kinds(divergences: Sequence[Any]) -> set[str]:
    return {d.problem.category for d in divergences}


def test_the_alternatives_are_expected_not_just_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a backend without the capability nothing is expected of them; with it, the emulator's own answers
    (in-order queue, breaking both ends, ...) are divergences: an alternative replaces an answer, it does
    not make everything acceptable. Random sequences alone: a replayed regression that diverges first would
    end the run before any sequence expects an alternative."""
    monkeypatch.setattr("pytest_san.model.run.REGRESSIONS", ())
    plain = ModelRun(EmulatorBackend(), ModelBudget(sequences=30, steps=40, seed=4), log=_quiet).run()
    assert plain.divergences == [] and not plain.alternatives
    claimed = ModelRun(_ClaimsVerbs(EmulatorBackend()), VERBS, log=_quiet).run()  # type: ignore[arg-type]
    assert claimed.divergences, "the emulator passed as a verbs backend"
    assert claimed.alternatives


def test_a_send_that_gives_up_waiting_breaks_only_its_end() -> None:
    from pytest_san.model.reference import Model
    from pytest_san.model.steps import Key, Register, Transfer, plan_for
    from pytest_san.spi.contract import Status

    model = Model(plan_for(2), Traits(alts=alternatives.active({"verbs"}), desc_size=20))
    model.apply(Register(0, "memory", (0, 0, 0, 64), 3, reg=1))
    model.bind(Register(0, "memory", (0, 0, 0, 64), 3, reg=1), 0x1234)
    assert model.apply(Transfer(0, "send", (((0, 0, 0, 8), Key(reg=1)),), op=1)).returns == "op"
    assert model.waiting_sends() == [(0, 1)]
    exp = model.gave_up(0)
    assert exp.done == {1: (frozenset({Status.CONNECTION_RESET}), 0)}
    assert alternatives.RNR_BOUNDED in exp.alternatives
    assert (model.socks[0].state, model.socks[1].state, model.socks[1].dead_peer) == ("error", "connected", True)
    assert model.waiting_sends() == []


def test_closing_the_peer_of_a_waiting_send_allows_that_it_gave_up_first() -> None:
    """A waiting send may give up (send-wait-bounded) a moment before its end learns that the peer closed:
    the send ends CONNECTION_RESET either way, its end's other operations ABORTED or CONNECTION_RESET. Without
    the alternative the model keeps the one answer (found by CI's lab run: seed 1, sequences 17 and 183)."""
    from pytest_san.model.reference import Model
    from pytest_san.model.steps import Close, Key, Register, Transfer, plan_for
    from pytest_san.spi.contract import Status

    def waiting_send_and_recv(alts: frozenset[str]) -> Model:
        model = Model(plan_for(2), Traits(alts=alts, desc_size=20))
        reg = Register(0, "memory", (0, 0, 0, 64), 3, reg=1)
        model.apply(reg)
        model.bind(reg, 0x1234)
        model.apply(Transfer(0, "recv", (((0, 0, 0, 8), Key(reg=1)),), op=1))
        model.apply(Transfer(0, "send", (((0, 0, 8, 8), Key(reg=1)),), op=2))
        assert model.waiting_sends() == [(0, 2)]
        return model

    exp = waiting_send_and_recv(alternatives.active({"verbs"})).apply(Close(1))
    assert exp.done == {1: (frozenset({Status.ABORTED, Status.CONNECTION_RESET}), 0),
                        2: (frozenset({Status.CONNECTION_RESET}), 0)}
    exp = waiting_send_and_recv(frozenset()).apply(Close(1))
    assert exp.done == {1: (frozenset({Status.CONNECTION_RESET}), 0), 2: (frozenset({Status.CONNECTION_RESET}), 0)}


def test_a_give_up_seen_with_a_step_is_not_compared_with_the_other_backend() -> None:
    """Differential mode: a send that gave up (send-wait-bounded) completes beside whatever step runs then;
    the emulator never gives up, so those completions are left out of the answers compared (CI's lab run:
    seed 1, sequence 102, a close of another connection), the step's own completions are not."""
    from pytest_san.model.execute import Seen, _merged
    from pytest_san.model.state import Expect

    gave_up = Seen(Expect(), done={3: "CONNECTION_RESET", 1: "ABORTED"})
    step = _merged(Seen(Expect(), call="done", done={5: "CONNECTION_RESET"}), gave_up)
    emulator = Seen(Expect(), call="done", done={5: "CONNECTION_RESET"})
    assert step.answer() == emulator.answer()
    emulator.done[5] = "ABORTED"
    assert step.answer() != emulator.answer()


def test_a_waiting_send_the_step_delivered_did_not_give_up() -> None:
    """A send waiting longer than its race's ``after`` that completes SUCCESS because the step posted the peer's
    receive was delivered, not given up (send-wait-bounded): the model must not be rewound to a give-up.

    Found by CI's model on rxe 6.12 (differential, seed 1, sequence 54, did not reproduce on replay): at a
    step whose receive let an old waiting send complete, another check failed, the run took the send's
    done() for a give-up, judged the step again on a model where the send and the RDMA writes behind it
    had ended, and reported the writes' bytes, which had landed, as a divergence."""
    import time
    import types

    from pytest_san import Completion
    from pytest_san.model import racing
    from pytest_san.model.handles import Handles
    from pytest_san.model.steps import Key, Transfer
    from pytest_san.spi.contract import Status

    class Op:
        def __init__(self, completion: Completion | None) -> None:
            self.completion = completion

        def done(self) -> bool:
            return self.completion is not None

        def wait(self, timeout: float | None = 10.0) -> Completion:
            if self.completion is None:
                raise TimeoutError("pending")
            return self.completion

    alts = alternatives.active({"verbs"})
    assert alternatives.RNR_BOUNDED in alts
    model = _model(alts)
    model.apply(Transfer(0, "send", (((0, 0, 0, 8), Key(reg=1)),), op=3))
    assert model.waiting_sends() == [(0, 3)]
    world = types.SimpleNamespace(backend=object())  # a backend without Batching: the looks are made in turn
    handles = Handles(world)  # type: ignore[arg-type]  # only its backend is used
    handles.posted = {3: time.monotonic() - 10}
    verdicts = {}
    for name, completion in (("pending", None), ("delivered", Completion(Status.SUCCESS, 8)),
                             ("gave up", Completion(Status.CONNECTION_RESET))):
        handles.ops = {3: Op(completion)}  # type: ignore[dict-item]
        verdicts[name] = bool(racing.gave_up(handles, racing.old(alternatives.races(alts), model, handles)))
    assert verdicts == {"pending": False, "delivered": False, "gave up": True}


def _model(alts: frozenset[str], *, sends_wait: bool = True) -> Any:
    from pytest_san.model.reference import Model
    from pytest_san.model.steps import Register, plan_for

    model = Model(plan_for(2), Traits(alts=alts, desc_size=20, sends_wait=sends_wait))
    for sock, proc, handle in ((0, 0, 0x1234), (1, 2, 0x5678)):  # slot 0 joins processes 0 and 2
        reg = Register(sock, "memory", (proc, 0, 0, 64), 3, reg=sock + 1)
        model.apply(reg)
        model.bind(reg, handle)
    return model


def test_a_read_into_several_buffers_may_be_refused_where_the_device_reads_into_one() -> None:
    from pytest_san.model.steps import Key, Register, Transfer

    def read(alts: frozenset[str], entries: int) -> Any:
        model = _model(alts)
        window = Register(1, "rdma", (2, 1, 0, 40), 3, reg=3)
        model.apply(window)
        model.bind(window, b"\1" * 20)
        views = tuple(((0, 0, 8 * i, 8), Key(reg=1)) for i in range(entries))
        return model.apply(Transfer(0, "rdma_read", views, op=1, desc=Key(reg=3)))

    one = alternatives.active({"verbs", "iwarp"})
    assert read(one, 2).returns == "op" and read(one, 2).instead == {alternatives.READ_ONE_BUFFER: {"WSAEINVAL"}}
    assert read(one, 1).returns == "op" and not read(one, 1).instead
    scatter = alternatives.active({"verbs", "iwarp", "rdma_read_scatter"})
    assert read(scatter, 2).returns == "op" and read(frozenset(), 4).returns == "op"


def test_on_iwarp_an_error_ends_the_connection() -> None:
    """A transfer refused for its local buffers: on IB/RoCE only its end goes to error (the peer's receive
    stays pending); on iWARP the connection ends, the peer's receive completing ABORTED or CONNECTION_RESET."""
    from pytest_san.model.steps import Key, Transfer
    from pytest_san.spi.contract import Status

    def refused(alts: frozenset[str]) -> Any:
        model = _model(alts)
        model.apply(Transfer(1, "recv", (((2, 0, 0, 8), Key(reg=2)),), op=1))
        exp = model.apply(Transfer(0, "send", (((0, 1, 0, 8), Key(reg=1)),), op=2))  # outside the registration
        return model, exp

    model, exp = refused(alternatives.active({"verbs", "send_waits"}))
    assert exp.done == {2: (frozenset({Status.LOCAL_PROTECTION}), 0)}
    assert (model.socks[0].state, model.socks[1].state) == ("error", "connected")
    model, exp = refused(alternatives.active({"verbs", "iwarp"}))
    assert exp.done == {2: (frozenset({Status.LOCAL_PROTECTION}), 0),
                        1: (frozenset({Status.ABORTED, Status.CONNECTION_RESET}), 0)}
    assert (model.socks[0].state, model.socks[1].state) == ("error", "error")
    assert alternatives.ERROR_ENDS_CONNECTION in exp.alternatives


def test_without_send_waits_a_send_no_receive_waits_for_is_skipped() -> None:
    from pytest_san.model.steps import Key, Transfer

    send = Transfer(0, "send", (((0, 0, 0, 8), Key(reg=1)),), op=2)
    assert _model(frozenset()).apply(send).returns == "op"
    model = _model(frozenset(), sends_wait=False)
    assert model.apply(send).skip
    model.apply(Transfer(1, "recv", (((2, 0, 0, 8), Key(reg=2)),), op=1))
    assert model.apply(send).returns == "op"


class _ClaimsIwarp(_ClaimsVerbs):
    @property
    def capabilities(self) -> frozenset[str]:
        return (self._base.capabilities | {"verbs", "iwarp"}) - {"send_waits", "rdma_read_scatter"}


def test_the_iwarp_alternatives_are_expected_too() -> None:
    claimed = ModelRun(_ClaimsIwarp(EmulatorBackend()), VERBS, log=_quiet).run()  # type: ignore[arg-type]
    assert claimed.divergences, "the emulator passed as an iWARP backend"
    assert {alternatives.ERROR_ENDS_CONNECTION, alternatives.READ_ONE_BUFFER} & set(claimed.alternatives)


def test_more_entries_than_max_sge_are_expected_refused_only_in_the_reference_order() -> None:
    """How many scatter entries a provider takes is its own (CONTRACT.md section 4): a provider that takes more
    than MAX_SGE is not failed for it, so the model skips such a step unless the backend declares the reference
    order, which fixes MAX_SGE; a second fault still makes the step a refusal on either."""
    from pytest_san.model.reference import Model
    from pytest_san.model.steps import Key, Register, Transfer, plan_for
    from pytest_san.spi.contract import MAX_SGE

    def five_entries(reference_order: bool, owner: int = 0) -> Any:
        model = Model(plan_for(2), Traits(desc_size=20, reference_order=reference_order))
        reg = Register(0, "memory", (0, 0, 0, 64), 3, reg=1)
        model.apply(reg)
        model.bind(reg, 0x1234)
        entries = tuple(((owner if i == 0 else 0, 0, 8 * i, 8), Key(reg=1)) for i in range(MAX_SGE + 1))
        return model.apply(Transfer(0, "send", entries, op=1))

    assert five_entries(reference_order=False).skip
    refused = five_entries(reference_order=True)
    assert not refused.skip and refused.raises == {"WSAEINVAL"}
    two_faults = five_entries(reference_order=False, owner=1)  # and another process's buffer (R5)
    assert not two_faults.skip and "WSAEFAULT" in two_faults.raises
