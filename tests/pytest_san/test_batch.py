"""``pytest_san.batch`` in-process: each call made when added, results read once the block has ended, a call
naming a failed one not made."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import Access, SanError, WsaError
from pytest_san.batch import (
    Batch,
    Call,
    Ref,
    batch,
    done_ahead,
    first_error,
    is_alive,
    is_closed,
    is_connected,
    is_done,
    made_one_by_one,
    wait_for,
)
from pytest_san.spi.emulator import EmulatorBackend


@pytest.fixture
def backend() -> Any:
    made = EmulatorBackend()
    yield made
    made.reset()
    made.close()


def test_calls_are_made_when_added_and_read_after_the_block(backend: Any) -> None:
    a, _ = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    provider = backend.nodes[0].provider
    with batch(backend) as bt:
        buf = bt.call(a.process.alloc, 4096)
        handle = bt.call(provider.register_memory, a, buf.ref, Access.READ)
        assert provider.registrations(a), "in-process, the registration is made when it is added"
        with pytest.raises(RuntimeError, match="once its block has ended"):
            handle.value  # noqa: B018
    assert buf.value.length == 4096
    assert [r.kind for r in provider.registrations(a)] == ["memory"]
    provider.deregister_memory(a, handle.value)


def test_a_call_naming_a_failed_one_is_not_made_and_fails_the_same(backend: Any) -> None:
    a, _ = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    provider = backend.nodes[0].provider
    with batch(backend) as bt:
        too_big = bt.call(a.process.alloc, -1)
        handle = bt.call(provider.register_memory, a, too_big.ref, Access.READ)
        fine = bt.call(a.process.alloc, 64)
    assert handle.error is too_big.error and too_big.error is not None
    assert fine.error is None
    assert provider.registrations(a) == []
    assert first_error([fine, handle, too_big]) is too_big.error


def test_refs_inside_lists_and_tuples_are_resolved(backend: Any) -> None:
    a, b = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    pa, pb = backend.nodes[0].provider, backend.nodes[1].provider
    with batch(backend) as bt:
        src = bt.call(a.process.alloc, 8)
        dst = bt.call(b.process.alloc, 8)
        handle = bt.call(pa.register_memory, a, src.ref, Access.READ)
        desc = bt.call(pb.register_rdma_memory, b, dst.ref, Access.WRITE)
    src.value.write(b"abcdefgh")
    with batch(backend) as bt:
        op = bt.call(pa.rdma_write, a, [(src.ref, handle.ref)], desc.ref)
        completion = bt.call(wait_for, op.ref, 5.0)
        done = bt.call(is_done, op.ref)
    assert completion.value.bytes == 8 and done.value is True
    assert dst.value.read() == b"abcdefgh"
    pa.deregister_memory(a, handle.value)
    pb.deregister_rdma_memory(b, desc.value)


def test_property_reads_travel_as_functions(backend: Any) -> None:
    a, _ = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    with batch(backend) as bt:
        reads = [bt.call(is_connected, a), bt.call(is_closed, a), bt.call(is_alive, a.process)]
    assert [r.value for r in reads] == [True, False, True]


def test_a_failed_call_keeps_its_exception(backend: Any) -> None:
    a, _ = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    with batch(backend) as bt:
        bad = bt.call(backend.nodes[0].provider.deregister_memory, a, 12345)
    assert isinstance(bad.error, SanError) and bad.error.code is WsaError.WSAEINVAL
    with pytest.raises(SanError):
        bad.value  # noqa: B018


def test_a_batch_is_made_once() -> None:
    bt = Batch(object())
    with bt:
        one = bt.call(len, "abc")
    with pytest.raises(RuntimeError, match="made already"):
        bt.call(len, "x")
    assert one.value == 3


def test_a_block_that_raises_makes_nothing_more() -> None:
    class Deferred:
        def __init__(self) -> None:
            self.made: list[int] = []

        def make_together(self, calls: Any) -> list[Any]:
            self.made.append(len(calls))
            return [(True, None)] * len(calls)

    deferred = Deferred()
    with pytest.raises(KeyError), batch(deferred) as bt:
        bt.call(len, "abc")
        raise KeyError("in the block")
    assert deferred.made == []
    with batch(deferred) as bt:
        bt.call(len, "abc")
    assert deferred.made == [1]


def test_one_by_one_resolves_what_earlier_calls_returned() -> None:
    outcomes = made_one_by_one([Call(list, ("ab",), {}), Call(len, (Ref(0),), {}), Call(int, ("x",), {}),
                                Call(len, ([Ref(2)],), {})])
    assert outcomes[:2] == [(True, ["a", "b"]), (True, 2)]
    assert outcomes[2][0] is False and isinstance(outcomes[2][1], ValueError)
    assert outcomes[3] == (False, outcomes[2][1])


def test_done_ahead_answers_each_operation_by_id_and_leaves_out_a_failed_answer(backend: Any) -> None:
    _, b = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    pb = backend.nodes[1].provider
    buf = b.process.alloc(8)
    pending = pb.recv(b, [(buf, pb.register_memory(b, buf, Access.WRITE))])

    class Broken:
        def done(self) -> bool:
            raise RuntimeError("its agent is gone")

    broken = Broken()
    answered = done_ahead(backend, [pending, broken])  # type: ignore[list-item]
    assert answered == {id(pending): False}
    # It holds what it answers for: a switch that drops an operation meanwhile cannot see its id taken by a new one
    # (test_switch_flow's late completions failed so when the answers were a plain dict).
    assert answered.ops == [pending]


def test_a_wait_after_a_refused_call_is_not_made(backend: Any) -> None:
    """``wait_for(op, timeout, after)``: an operation is not waited for when the call it depends on failed (a
    receive, when the send that would complete it was refused: else the wait would run its whole timeout)."""
    a, b = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    pb = backend.nodes[1].provider
    sink = b.process.alloc(8)
    recv = pb.recv(b, [(sink, pb.register_memory(b, sink, Access.WRITE))])
    with batch(backend) as bt:
        refused = bt.call(a.process.alloc, -1)
        waited = bt.call(wait_for, recv, 5.0, refused.ref)
    assert refused.error is not None and waited.error is refused.error
    assert not recv.done()
    pb.close_socket(b)


def test_a_wait_after_a_call_that_returned_is_made(backend: Any) -> None:
    a, b = backend.connect_sockets(backend.nodes[0].default_process, backend.nodes[1].default_process)
    pa, pb = backend.nodes[0].provider, backend.nodes[1].provider
    sink, src = b.process.alloc(8), a.process.alloc(8)
    src.write(b"12345678")
    recv = pb.recv(b, [(sink, pb.register_memory(b, sink, Access.WRITE))])
    with batch(backend) as bt:
        send = bt.call(pa.send, a, [(src, pa.register_memory(a, src, Access.READ))])
        waited = bt.call(wait_for, recv, 5.0, send.ref)
        bt.barrier()
        read = bt.call(sink.read)
    assert send.error is None and waited.value.bytes == 8
    assert read.value == b"12345678"
    assert [c.after for c in bt.calls] == [0, 0, 2], "the read follows both calls before the barrier"
    pa.close_socket(a)


class OneByOne:
    """A backend with ``Batching`` that makes a batch's calls in turn when it ends, as hil makes calls it cannot send
    together: so ``Later.ref`` is a stand-in (``Ref``) until then, to be resolved wherever an argument holds it."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def make_together(self, calls: Any) -> list[Any]:
        self.batches.append(len(calls))
        return made_one_by_one(calls)


def _echo(*args: object, **kwargs: object) -> tuple[tuple[object, ...], dict[str, object]]:
    return args, kwargs


def _number(text: str) -> int:
    return int(text)


def test_refs_in_tuples_lists_and_keywords_are_resolved_when_made_together() -> None:
    """With ``Batching`` a call is made when the block ends, not when it is added; an earlier call's ``ref``
    anywhere in a tuple, a list or a keyword argument is replaced by what that call returned (a list stays a list,
    a tuple a tuple), and a call naming a failed one there fails the same."""
    made: list[str] = []

    def record(value: str) -> str:
        made.append(value)
        return value

    backend = OneByOne()
    with batch(backend) as bt:
        word = bt.call(record, "ab")
        assert made == [], "with Batching, a call is made when the block ends"
        bad = bt.call(_number, "x")
        both = bt.call(_echo, (word.ref, 1), [2, word.ref], key=word.ref, n=3)
        plain = bt.call(_echo, 1, key="k")
        failed = bt.call(_echo, (1, bad.ref))
        failed_by_name = bt.call(_echo, key=[bad.ref, 2])
    assert made == ["ab"] and backend.batches == [6]
    assert both.value == ((("ab", 1), [2, "ab"]), {"key": "ab", "n": 3})
    assert plain.value == ((1,), {"key": "k"})
    assert isinstance(bad.error, ValueError)
    assert failed.error is bad.error and failed_by_name.error is bad.error


def test_done_ahead_asks_a_batching_backend_together() -> None:
    """``done_ahead``: every operation's ``done`` asked in one batch (on a lab one round trip)."""

    class Op:
        def __init__(self, done: bool) -> None:
            self._done = done

        def done(self) -> bool:
            return self._done

    backend = OneByOne()
    ops = [Op(True), Op(False)]
    answered = done_ahead(backend, ops)  # type: ignore[arg-type]  # stand-ins with done() alone
    assert backend.batches == [2]
    assert answered == {id(ops[0]): True, id(ops[1]): False}


def test_wait_for_waits_with_the_timeout_it_is_given() -> None:
    """``wait_for(op, timeout)`` is ``op.wait(timeout)``."""

    class Op:
        def __init__(self) -> None:
            self.timeouts: list[float | None] = []

        def wait(self, timeout: float | None = 10.0) -> str:
            self.timeouts.append(timeout)
            return "completion"

    op = Op()
    got: object = wait_for(op, 0.25)  # type: ignore[arg-type]  # a stand-in with wait() alone
    assert got == "completion" and op.timeouts == [0.25]
