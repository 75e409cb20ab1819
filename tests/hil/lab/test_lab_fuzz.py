"""The fuzz of tests/support/fuzz_spi.py on real verbs: the two Soft-RoCE guests of a running lab.

Run only when ``SAN_LAB_INVENTORY`` names the inventory of a running lab (skipped otherwise, saying so);
``.ci/run`` runs it in its lab stage. Every call crosses SSH, the agent and a verbs child process to the
NIC, so what the fuzz checks -- bad input refused with the contract's error, a refused call changing
nothing, no byte outside a window moved, nothing leaked -- is checked for the real provider.

Real completions arrive when the NIC is done, so the same calls need not take the same path twice:
Hypothesis' engine, which replays and shrinks, calls that flaky. Here the fuzz's own rules are driven
by a seeded random generator instead, and a failure shows the seed and every step that ran
(``SAN_FUZZ_SEED`` replays it). Soft-RoCE under TCG takes tens of milliseconds a call: the budget is
small (``SAN_FUZZ_EXAMPLES`` sequences of ``SAN_FUZZ_STEPS`` steps).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest

from hil.controller.backend import HilBackend
from tests.support.fuzz_spi import SpiFuzz, fuzz_machine
from tests.support.lab_hosts import running_lab_hosts

EXAMPLES = int(os.environ.get("SAN_FUZZ_EXAMPLES", "12"))
STEPS = int(os.environ.get("SAN_FUZZ_STEPS", "20"))
# The rules of SpiFuzz, each taking a random.Random (transfers twice, as Hypothesis weighs them).
RULES = ("registration", "transfer", "transfer_again", "sockets_and_processes", "proxy", "switch")


def run_seeded(machine: type[SpiFuzz], examples: int, steps: int, seed: int) -> None:
    """``examples`` sequences of ``steps`` rules, every choice drawn from ``seed``."""
    for example in range(examples):
        rng = random.Random(f"{seed}/{example}")
        state = machine()
        trace: list[str] = []
        try:
            for _ in range(steps):
                name, draw = rng.choice(RULES), rng.getrandbits(64)
                trace.append(f"{name}(random.Random({draw}))")
                getattr(state, name)(random.Random(draw))
                state.tick()
        except BaseException as exc:
            try:
                state.teardown()
            except Exception as also:
                trace.append(f"(teardown then failed too: {also!r})")
            steps_run = "\n  ".join(trace)
            raise AssertionError(f"SAN_FUZZ_SEED={seed}, sequence {example}, steps:\n  {steps_run}\n{exc}") from exc
        state.teardown()


@pytest.fixture(scope="module")
def lab() -> Iterator[HilBackend]:
    backend = HilBackend(running_lab_hosts())
    yield backend
    backend.close()


def test_fuzz_real_verbs(lab: HilBackend) -> None:
    assert "verbs" in lab.capabilities
    seed = int(os.environ.get("SAN_FUZZ_SEED") or random.SystemRandom().getrandbits(32))
    print(f"lab fuzz: SAN_FUZZ_SEED={seed}, {EXAMPLES} sequences of {STEPS} steps")
    # Completions come from the NIC, after the call returns: the fuzz waits for them (not synchronous).
    run_seeded(fuzz_machine(lambda: lab, synchronous=False, timeout=60.0), EXAMPLES, STEPS, seed)
