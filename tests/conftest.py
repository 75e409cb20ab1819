"""Shared setup for pytest-san's own tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.inventory import HostConfig
from tests.support.lab_hosts import NESTED_ADDOPTS, host_configs
from tests.support.sshd import SSHD, SshServer, start_sshd

pytest_plugins = ["pytester"]

# Slow tests (marker ``slow``) run once, in CI's main test stage, and not in every tox environment
# (``-m "not slow"``): those that start a real OpenSSH server (the sshd fixture, directly or through
# another fixture) and those that need a running Soft-RoCE lab.
SLOW_FIXTURES = frozenset({"sshd", "shared_sshd"})
SLOW_MODULES = frozenset({"test_lab_faults.py", "test_lab_fuzz.py"})


def pytest_configure(config: pytest.Config) -> None:
    # The plugin is found through its pytest11 entry point: the package must be installed.
    if not config.pluginmanager.hasplugin("san"):
        raise pytest.UsageError("pytest-san is not installed in this environment: pip install -e '.[test]'")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _nested_runs_without_cache(request: pytest.FixtureRequest) -> None:
    """pytester's runs, in process or not, with NESTED_ADDOPTS (tests/support/lab_hosts.py): pytester clears
    PYTEST_ADDOPTS when it is made, so it is set once pytester is."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")
        request.getfixturevalue("monkeypatch").setenv("PYTEST_ADDOPTS", NESTED_ADDOPTS)


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


@pytest.fixture(scope="session")
def shared_sshd() -> Iterator[SshServer]:
    """A real OpenSSH server that logs in other users of this machine too (tests/support/users.py): its
    directory is outside pytest's private temporary tree, searchable by all."""
    if not SSHD.exists():
        pytest.skip(f"{SSHD} not found: apt-get install openssh-server to run the SSH transport tests")
    directory = Path(tempfile.mkdtemp(prefix="pytest-san-sshd-"))
    directory.chmod(0o755)
    try:
        server = start_sshd(directory)
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def remote_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The remote temporary directory of the loopback lab hosts: agents and leases (their scope) of one module."""
    return tmp_path_factory.mktemp("remote-tmp")


@pytest.fixture
def hosts(sshd: SshServer, remote_tmp: Path) -> list[HostConfig]:
    """Two emulator-engine lab hosts behind the test sshd (tests/support/lab_hosts.py)."""
    return host_configs(sshd, remote_tmp)
