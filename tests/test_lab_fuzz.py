"""The fuzz of tests/fuzz_spi.py on real verbs: the two Soft-RoCE guests of a running lab.

Run only when ``SAN_LAB_INVENTORY`` names the inventory of a running lab (skipped otherwise, saying so);
``.ci/run`` runs it in its lab stage. Every call crosses SSH, the agent and a verbs child process to the
NIC, so what the fuzz checks -- bad input refused with the contract's error, a refused call changing
nothing, no byte outside a window moved, nothing leaked -- is checked for the real provider. Soft-RoCE
under TCG takes a fraction of a second a call: the budget is small (SAN_FUZZ_EXAMPLES, SAN_FUZZ_STEPS).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fuzz_spi import run_fuzz
from hypothesis import Phase
from lab_hosts import running_lab_hosts

from hil.backend import HilBackend

EXAMPLES = int(os.environ.get("SAN_FUZZ_EXAMPLES", "12"))
STEPS = int(os.environ.get("SAN_FUZZ_STEPS", "20"))


@pytest.fixture(scope="module")
def lab() -> Iterator[HilBackend]:
    backend = HilBackend(running_lab_hosts())
    yield backend
    backend.close()


def test_fuzz_real_verbs(lab: HilBackend) -> None:
    assert "verbs" in lab.capabilities
    # Completions come from the NIC, after the call returns: the fuzz waits for them (not synchronous).
    # No shrinking: on TCG it took over five minutes; the failing sequence is printed as it ran.
    run_fuzz(lambda: lab, max_examples=EXAMPLES, steps=STEPS, synchronous=False, timeout=60.0,
             phases=[Phase.explicit, Phase.reuse, Phase.generate])
