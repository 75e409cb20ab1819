"""Every pair of call-time faults of every SPI call on a running lab's verbs engine (tests/support/fault_pairs.py).

Run only when ``SAN_LAB_INVENTORY`` names the inventory of a running lab (skipped otherwise, saying so). The
verbs engine checks a call's objects in the agent and the rest in the child that owns the socket and the device;
every case must still get the reference order's answer (pytest_san.spi.checks), as on the emulator, and change
nothing on the device. Every call is a round trip: ``SAN_PAIRS_SAMPLE=N`` makes N cases drawn with
``SAN_PAIRS_SEED`` (default 1) instead of all of them (CI runs a sample, nightly the whole product);
``SAN_PAIRS_ANSWERS=PATH`` writes each case's answer as JSON, to compare backends call by call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.controller.backend import HilBackend
from pytest_san.spi.checks import REFERENCE_ORDER
from tests.support.fault_pairs import cases, run_pairs, sample
from tests.support.lab_hosts import running_lab_hosts

SIZE = int(os.environ["SAN_PAIRS_SAMPLE"]) if os.environ.get("SAN_PAIRS_SAMPLE") else None
SEED = int(os.environ.get("SAN_PAIRS_SEED") or "1")


@pytest.fixture(scope="module")
def lab() -> Iterator[HilBackend]:
    backend = HilBackend(running_lab_hosts())
    yield backend
    backend.close()


def test_every_pair_of_faults_gets_the_tables_answer_on_verbs(lab: HilBackend) -> None:
    assert "verbs" in lab.capabilities and REFERENCE_ORDER in lab.capabilities
    chosen = sample(cases(), SIZE, SEED)
    answers: dict[str, str] = {}
    started = time.monotonic()
    problems = run_pairs(lab, chosen, answers)
    print(f"\nfault pairs on verbs: {len(answers)} of {len(cases())} cases (seed {SEED}) in "
          f"{time.monotonic() - started:.0f} s, {len(problems)} problem(s)")
    path = os.environ.get("SAN_PAIRS_ANSWERS")
    if path:
        Path(path).write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    assert problems == [], "\n".join(problems)
