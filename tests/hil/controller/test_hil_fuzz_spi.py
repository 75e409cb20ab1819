"""The fuzz of tests/support/fuzz_spi.py on the hil backend: two emulator-engine agents behind the test sshd.

Every call crosses the agent protocol (SSH, JSON lines, the controller's stand-ins), so what the
fuzz checks on the emulator in-process -- bad input refused with the contract's error, a refused
call changing nothing, no leak -- is checked here for the whole remote path. One backend serves
every example (it is reset after each, as the plugin resets it between tests). SAN_FUZZ_EXAMPLES
sets the number of sequences (a longer hunt).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.controller.backend import HilBackend
from tests.support.fuzz_spi import run_fuzz
from tests.support.lab_hosts import host_configs
from tests.support.sshd import SshServer

EXAMPLES = int(os.environ.get("SAN_FUZZ_EXAMPLES", "20"))


@pytest.fixture
def hil(sshd: SshServer, tmp_path: Path) -> Iterator[HilBackend]:
    backend = HilBackend(host_configs(sshd, tmp_path))
    yield backend
    backend.close()


def test_fuzz_hil_over_ssh(hil: HilBackend) -> None:
    assert len(hil.agents) == 2 and "hil" in hil.capabilities
    # The emulator engine completes an operation inside the call, as the emulator does in-process.
    run_fuzz(lambda: hil, max_examples=EXAMPLES, steps=25, synchronous=True)
