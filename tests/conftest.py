"""Shared setup for pytest-san's own tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.inventory import HostConfig
from tests.support.lab_hosts import host_configs
from tests.support.sshd import SSHD, SshServer, start_sshd

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # The plugin is found through its pytest11 entry point: the package must be installed.
    if not config.pluginmanager.hasplugin("san"):
        raise pytest.UsageError("pytest-san is not installed in this environment: pip install -e '.[test]'")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real OpenSSH server on 127.0.0.1 (throwaway keys), stopped with everything it started."""
    if not SSHD.exists():
        pytest.skip(f"{SSHD} not found: apt-get install openssh-server to run the SSH transport tests")
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def remote_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The remote temporary directory of the loopback lab hosts: agents and lease files of one module."""
    return tmp_path_factory.mktemp("remote-tmp")


@pytest.fixture
def hosts(sshd: SshServer, remote_tmp: Path) -> list[HostConfig]:
    """Two emulator-engine lab hosts behind the test sshd (tests/support/lab_hosts.py)."""
    return host_configs(sshd, remote_tmp)
