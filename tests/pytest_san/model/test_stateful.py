"""Stateful property test of the emulated provider against the reference model (pytest_san.model).

Hypothesis drives the package model's own rules -- register, deregister, transfer, scribble,
close, reconnect, each drawing its choices from one Hypothesis-made ``random.Random`` -- on a fresh
emulator per example, and checks everything after every step (``Side(full=True)``): the call's
answer (the error code, or the completion's status and byte count), ``registrations(socket)`` of
every socket (kind, range, access, refs), each proxy's live allocations against the live
registrations of its node (R12), every byte of every buffer (guards included), each socket's
``connected``/``closed``, and that operations the model holds pending are still pending. At the
end every socket is closed and nothing may leak (R11). Hypothesis shrinks a failure to the fewest
rule calls; the assertion says what was called, with what, and what the model expected.

The model itself is documented in pytest_san/model/reference.py and transfers.py; the same
checks run on any backend with ``pytest --pyargs pytest_san.model`` (tests/pytest_san/model/).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from pytest_san import Access
from pytest_san.model.alternatives import active
from pytest_san.model.divergence import answer, expected
from pytest_san.model.execute import Seen, Side
from pytest_san.model.generate import Generator
from pytest_san.model.naming import Namer
from pytest_san.model.state import Traits
from pytest_san.model.steps import Step
from pytest_san.model.world import World
from pytest_san.spi.emulator import EmulatorBackend

# Every choice inside a rule comes from one seeded Random per step: a single Hypothesis choice
# instead of a dozen ``data.draw`` calls. Hypothesis still shrinks the sequence of rule calls.
RND = st.randoms(use_true_random=True)


class SanMachine(RuleBasedStateMachine):
    """Random SPI sequences on the emulator, checked against the package model after every step."""

    make_backend: Callable[[], Any] = EmulatorBackend

    def __init__(self) -> None:
        super().__init__()
        backend = type(self).make_backend()
        self.side = Side("emulator", World(backend), Traits(alts=active(backend.capabilities)), full=True)
        self.gen = Generator(self.side.start(), random.Random(0))
        self.steps: list[Step] = []
        self.failed = False  # a step failed: teardown must not hide that failure behind its own

    def _enabled(self, name: str) -> bool:
        return name in self.gen.rules()

    def _do(self, rnd: random.Random, name: str) -> None:
        self.gen.rnd = rnd
        self.gen.quiet += 1
        step = self.gen.rules()[name][1]()
        self.steps.append(step)
        seen = self.side.run(step)
        if seen.problems:
            namer = Namer(self.steps)
            said, wanted = answer(seen, step, namer), expected(seen.expect, step, namer)
            self._fail(seen, f"-> answered {said}; the model: {wanted}")

    def _fail(self, seen: Seen, after: str) -> None:
        self.failed = True
        namer = Namer(self.steps)
        done = "\n".join(f"  {i + 1}. {namer.step(s)}" for i, s in enumerate(self.steps))
        raise AssertionError(f"{seen.problems[0].message}\nafter the steps:\n{done}\n{after}")

    @rule(rnd=RND)
    def register(self, rnd: random.Random) -> None:
        self._do(rnd, "register")

    @precondition(lambda self: self._enabled("deregister"))
    @rule(rnd=RND)
    def deregister(self, rnd: random.Random) -> None:
        self._do(rnd, "deregister")

    @precondition(lambda self: self._enabled("transfer"))
    @rule(rnd=RND)
    def transfer(self, rnd: random.Random) -> None:
        self._do(rnd, "transfer")

    @precondition(lambda self: self._enabled("scribble"))
    @rule(rnd=RND)
    def scribble(self, rnd: random.Random) -> None:
        self._do(rnd, "scribble")

    @precondition(lambda self: self._enabled("close"))
    @rule(rnd=RND)
    def close(self, rnd: random.Random) -> None:
        self._do(rnd, "close")

    @precondition(lambda self: self._enabled("reconnect"))
    @rule(rnd=RND)
    def reconnect(self, rnd: random.Random) -> None:
        self._do(rnd, "reconnect")

    def teardown(self) -> None:
        if self.failed:
            self.side.abandon()
            return
        seen = self.side.finish()  # every socket closed, everything checked, backend.leaks() == [] (R11)
        if seen.problems:
            self._fail(seen, "and every socket closed")


SETTINGS = settings(max_examples=120, deadline=None, stateful_step_count=40, database=None, print_blob=True)

TestSanMachine = SanMachine.TestCase
TestSanMachine.settings = SETTINGS


# -- the model has teeth: providers that break a rule are caught ---------------------------------

class _Wrapped:
    def __init__(self, base: Any) -> None:
        self._base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _IgnoresAccess(_Wrapped):
    """Registers everything READWRITE: R6/R7 broken."""

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        return self._base.register_memory(socket, buffer, Access.READWRITE if access in (1, 2, 3) else access)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: Any = None) -> Any:
        access = Access.READWRITE if access in (1, 2, 3) else access
        return self._base.register_rdma_memory(socket, buffer, access, descriptor_size)


class _KeepsMemory(_Wrapped):
    """A deregistration that releases nothing: R3/R12 broken."""

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        if not any(r.kind == "memory" and r.handle == handle for r in self._base.registrations(socket)):
            self._base.deregister_memory(socket, handle)


class _IgnoresOffset(_Wrapped):
    """RDMA writes land at the start of the target window, whatever the offset: bytes misplaced."""

    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: bytes, offset: int = 0) -> Any:
        return self._base.rdma_write(socket, local_buffers, target_descriptor, min(offset, 0))


BROKEN = [_IgnoresAccess, _KeepsMemory, _IgnoresOffset]


@pytest.mark.parametrize("wrapper", BROKEN)
def test_model_catches_broken_provider(wrapper: Callable[[Any], Any]) -> None:
    class Broken(SanMachine):
        @staticmethod
        def make_backend() -> Any:
            return EmulatorBackend(wrap_provider=lambda node, base: wrapper(base))

    # Derandomized, no shrinking: the same few examples every run, so this stays fast and stable.
    quick = settings(SETTINGS, max_examples=100, derandomize=True, phases=[Phase.generate], print_blob=False)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(Broken, settings=quick)
