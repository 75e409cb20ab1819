"""A call with several faults: any of their errors from a provider of one's own, the reference order's from a backend
that declares it (``reference_order``), in the model and in its differential mode.

The provider a conftest plugs in through ``pytest_san_make_provider`` answers one case otherwise:
register_rdma_memory with both invalid access flags and a too-small ``descriptor_size`` raises WSAEFAULT (the
probe's answer) where the reference order (pytest_san.spi.checks.ORDER) checks the access first: WSAEINVAL. The
contract accepts either code, so the model passes it, and so does the differential mode: a plugin's provider
does not follow the reference order (the plugin drops ``reference_order`` from its node). The same provider on
a backend that declares it is held to the table: the model expects the access's WSAEINVAL.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import SanError, WsaError
from pytest_san.model.run import ModelRun
from pytest_san.model.state import Traits
from pytest_san.model.steps import Reconnect, Register
from pytest_san.spi.checks import REFERENCE_ORDER
from pytest_san.spi.emulator import EmulatorBackend
from pytest_san.spi.protocols import ModelBudget

CONFTEST = '''
from pytest_san import SanError, WsaError


class OneCaseOtherwise:
    def __init__(self, base):
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)

    def register_rdma_memory(self, socket, buffer, access, descriptor_size=None):
        if access not in (1, 2, 3) and descriptor_size is not None and descriptor_size < 20:
            raise SanError(WsaError.WSAEFAULT, "planted: the probe first", required_size=20)
        return self._base.register_rdma_memory(socket, buffer, access, descriptor_size)


def pytest_san_make_provider(config, node, provider):
    return OneCaseOtherwise(provider)
'''

# Enough sequences that the planted case comes up (seed 7 meets it in sequence 3).
SEED, SEQUENCES, STEPS = 7, 40, 40
ARGS = ("--pyargs", "pytest_san.model", "--san-model-seed", str(SEED),
        "--san-model-sequences", str(SEQUENCES), "--san-model-steps", str(STEPS))


class OneCaseOtherwise:
    """The conftest's provider, for a backend built here."""

    def __init__(self, base: Any) -> None:
        self._base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Any, descriptor_size: Any = None) -> bytes:
        if access not in (1, 2, 3) and descriptor_size is not None and descriptor_size < 20:
            raise SanError(WsaError.WSAEFAULT, "planted: the probe first", required_size=20)
        result: bytes = self._base.register_rdma_memory(socket, buffer, access, descriptor_size)
        return result


def test_the_model_accepts_another_allowed_code_of_a_plugins_provider(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.runpytest_subprocess(*ARGS).assert_outcomes(passed=1)


def test_so_does_the_differential_mode(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.runpytest_subprocess(*ARGS, "--san-model-differential").assert_outcomes(passed=1)


@pytest.mark.parametrize("differential", [False, True])
def test_a_backend_that_declares_the_order_is_held_to_it(differential: bool) -> None:
    # Built by hand, the backend keeps its claim about its providers (the plugin drops it for a replaced one).
    backend = EmulatorBackend(wrap_provider=lambda node, p: OneCaseOtherwise(p))
    assert REFERENCE_ORDER in backend.capabilities
    logged: list[str] = []
    budget = ModelBudget(sequences=SEQUENCES, steps=STEPS, seed=SEED, differential=differential)
    summary = ModelRun(backend, budget, log=logged.append).run()
    backend.close()
    (div,) = summary.divergences
    assert (div.kind, div.side, div.problem.category, div.step_kind) == ("model", "emulator", "call",
                                                                         "Register(rdma)")
    assert "answered WSAEFAULT, expected WSAEINVAL" in div.problem.message
    *before, step = div.steps  # shrunk to the one call (on a socket a reconnect may have made)
    assert all(isinstance(made, Reconnect) for made in before)
    assert isinstance(step, Register) and step.kind == "rdma" and step.access not in (1, 2, 3)
    assert step.size is not None and step.size < 20


def test_the_model_expects_one_answer_of_a_backend_that_follows_the_order() -> None:
    from pytest_san.model.reference import Model
    from pytest_san.model.steps import Key, Transfer, plan_for

    bad = Register(0, "rdma", (0, 0, 0, 8), 4, reg=1, size=4)  # invalid access flags, a too-small descriptor_size
    assert Model(plan_for(3), Traits(desc_size=20)).apply(bad).raises == {"WSAEINVAL", "WSAEFAULT"}
    assert Model(plan_for(3), Traits(desc_size=20, reference_order=True)).apply(bad).raises == {"WSAEINVAL"}
    # Another process's entry and a malformed descriptor: whose the entry is, first.
    write = Transfer(0, "rdma_write", (((2, 0, 0, 8), Key(junk=1)),), op=1, desc=Key(junk=b"\0" * 4))
    assert Model(plan_for(3), Traits(desc_size=20)).apply(write).raises == {"WSAEINVAL", "WSAEFAULT"}
    assert Model(plan_for(3), Traits(desc_size=20, reference_order=True)).apply(write).raises == {"WSAEFAULT"}
