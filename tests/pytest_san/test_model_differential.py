"""The differential mode finds a planted divergence that the model alone accepts, and shows it shrunk.

The provider a conftest plugs in through ``pytest_san_make_provider`` answers one case otherwise:
register_rdma_memory with both invalid access flags and a too-small ``descriptor_size`` raises WSAEINVAL
where the emulator raises WSAEFAULT. The contract accepts either code for a call with several faults,
so the model run passes; the differential run, comparing with a fresh emulator step by step, does not.
"""

from __future__ import annotations

import json

import pytest

CONFTEST = '''
from pytest_san import SanError, WsaError


class OneCaseOtherwise:
    def __init__(self, base):
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)

    def register_rdma_memory(self, socket, buffer, access, descriptor_size=None):
        if access not in (1, 2, 3) and descriptor_size is not None and descriptor_size < 20:
            raise SanError(WsaError.WSAEINVAL, "planted: the access flags first")
        return self._base.register_rdma_memory(socket, buffer, access, descriptor_size)


def pytest_san_make_provider(config, node, provider):
    return OneCaseOtherwise(provider)
'''

# Enough sequences that the planted case comes up (seed 7 meets it in sequence 3).
ARGS = ("-p", "no:cacheprovider", "--pyargs", "pytest_san.model", "--san-model-seed", "7",
        "--san-model-sequences", "40", "--san-model-steps", "40")


def test_the_model_alone_accepts_either_code(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.runpytest_subprocess(*ARGS).assert_outcomes(passed=1)


def test_differential_mode_finds_and_shrinks_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(*ARGS, "--san-model-differential", "--san-report", str(report))
    result.assert_outcomes(failed=1)
    model = json.loads(report.read_text())["model"]
    assert model["differential"] is True
    (div,) = model["divergences"]
    assert (div["kind"], div["side"], div["category"], div["step"]) == ("differential", "both", "differ",
                                                                        "Register(rdma)")
    # Shrunk to the one call, numbered, in SPI terms, with both sides' answers.
    setup, step, caret = div["steps"]
    assert setup.startswith("  setup: p0 = the default process on node 0")
    assert "1. s" in step and "register_rdma_memory(" in step and "descriptor_size=" in step
    assert step.endswith("-> emulator: WSAEINVAL; reference emulator: WSAEFAULT"), step
    assert "emulator answered WSAEINVAL, reference emulator answered WSAEFAULT" in caret
    result.stdout.fnmatch_lines(["*1 divergence(s) from the model on emulator (replay: --san-model-seed 7)*",
                                 "*both: differ after a Register(rdma) step (seed 7, sequence *, 1 steps after*"])
