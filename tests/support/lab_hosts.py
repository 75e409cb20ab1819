"""Two emulator-engine lab hosts behind the test sshd, for the lease, xdist and nightly tests.

Both inventory entries point at the same OpenSSH server; their distinct names give distinct
leases. ``san_remote_tmp`` is a directory of this test session, so the agents and leases of
these tests never meet those of another run on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import pytest

import hil.inventory
from hil.inventory import HostConfig, load_inventory
from tests.support.sshd import SshServer

NAMES = ("leaseA", "leaseB")


def host_configs(sshd: SshServer, remote_tmp: Path, names: Sequence[str] = NAMES) -> list[HostConfig]:
    return [sshd.host_config(name=name, engine="emulator", loopback=True,
                             extra={"san_remote_tmp": str(remote_tmp)}) for name in names]


def write_inventory(path: Path, hosts: Sequence[HostConfig]) -> Path:
    """``hosts`` in group san, as :func:`hil.inventory.write_inventory` writes them (JSON for a .json path)."""
    return hil.inventory.write_inventory(path, hosts)


NESTED_ADDOPTS = "-p no:cacheprovider"
"""What every pytest a test starts runs with, as PYTEST_ADDOPTS (the runs of this checkout have it from
pyproject.toml's addopts; a nested run's directory has no pytest configuration): no cache plugin, so that no run
writes a .pytest_cache. pytester's runs have it from tests/conftest.py, the others from :func:`pytest_env`."""


def pytest_env() -> dict[str, str]:
    """The environment for a nested pytest: nothing of an outer xdist worker or PYTEST_ADDOPTS, and
    NESTED_ADDOPTS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    env["PYTEST_ADDOPTS"] = NESTED_ADDOPTS
    return env


def start_pytest(args: Sequence[str], cwd: Path, output: IO[bytes]) -> subprocess.Popen[bytes]:
    """``python -m pytest ARGS`` in ``cwd`` (no cache: :func:`pytest_env`), stdout and stderr into ``output``."""
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=cwd,
                            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=pytest_env())


INVENTORY_ENV = "SAN_LAB_INVENTORY"


def running_lab_hosts() -> list[HostConfig]:
    """The verbs hosts of the running lab that SAN_LAB_INVENTORY names; the test is skipped (saying why)
    when it names none, and fails when it names a file that is not there."""
    value = os.environ.get(INVENTORY_ENV)
    if not value:
        pytest.skip(f"{INVENTORY_ENV} is not set: these tests need a running Soft-RoCE lab "
                    f"(san-hil lab up --hosts 2 --inventory-out lab.yaml; {INVENTORY_ENV}=lab.yaml)")
    path = Path(value)
    if not path.is_file():  # asked for, but not there: a broken CI job, not a reason to skip
        pytest.fail(f"{INVENTORY_ENV}={value}: no such file (is the lab up?)")
    hosts = load_inventory(path).select("san")
    not_verbs = [h.name for h in hosts if h.engine != "verbs"]
    if len(hosts) < 2 or not_verbs:
        pytest.skip(f"{INVENTORY_ENV}={value}: these tests need two verbs hosts in group san, got "
                    f"{[h.name for h in hosts]} (not verbs: {not_verbs})")
    return hosts
