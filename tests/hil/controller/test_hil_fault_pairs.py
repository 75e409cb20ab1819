"""Every pair of call-time faults of every SPI call over the hil backend: a local agent with the emulator engine.

Each call crosses the agent protocol (the controller's stand-ins, JSON lines, the agent's codec): an argument
the controller cannot send as itself reaches the engine as a stand-in it refuses as in-process, so every case
gets the reference order's answer here too (tests/support/fault_pairs.py), and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.controller.backend import HilBackend
from hil.inventory.model import HostConfig
from pytest_san.spi.checks import REFERENCE_ORDER
from tests.support.fault_pairs import SLOTS, cases, run_pairs


@pytest.fixture(scope="module")
def hil(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HilBackend]:
    remote_tmp: Path = tmp_path_factory.mktemp("agent")
    host = HostConfig(name="local", host="localhost", connection="local", engine="emulator", loopback=True,
                      extra={"san_remote_tmp": str(remote_tmp)})
    backend = HilBackend([host])
    yield backend
    backend.close()


def test_the_backend_declares_the_reference_order(hil: HilBackend) -> None:
    assert REFERENCE_ORDER in hil.capabilities


@pytest.mark.parametrize("call", list(SLOTS))
def test_every_pair_of_faults_gets_the_tables_answer_and_changes_nothing(hil: HilBackend, call: str) -> None:
    answers: dict[str, str] = {}
    assert run_pairs(hil, cases([call]), answers) == []
    hil.reset()
    assert len(answers) == len(cases([call]))
