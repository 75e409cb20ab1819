"""The agent's floor: lab hosts run it with their system python3, standard library only, Python 3.9 or later.

The controller needs Python 3.10, the agent does not: here it is pushed and started as the controller
starts it (local transport, the emulator engine) with a Python 3.9 interpreter, and driven through the
public API. Skipped, saying where it looked, when this machine has no Python 3.9; ``SAN_PYTHON39`` names
one explicitly (then a broken one fails instead of skipping).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.controller.backend import HilBackend
from hil.inventory import HostConfig
from pytest_san import Access, SanError, Status, Switch, WsaError
from tests.support import readme

FLOOR = (3, 9)
ENV = "SAN_PYTHON39"
NAME = f"python{FLOOR[0]}.{FLOOR[1]}"


def _version(python: str) -> tuple[int, int] | None:
    try:
        done = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=60, check=False)
    except OSError:
        return None
    if done.returncode != 0:  # e.g. a pyenv shim for a version that is not selected
        return None
    major, minor = done.stdout.split()
    return int(major), int(minor)


def candidates() -> list[str]:
    """Where a Python 3.9 may be: PATH, pyenv's versions, the usual system places."""
    found = [p for p in (shutil.which(NAME),) if p]
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    with contextlib.suppress(OSError):  # another user's pyenv (PYENV_ROOT=/root/.pyenv kept by su): not ours
        found += sorted(str(p) for p in pyenv_root.glob(f"versions/{FLOOR[0]}.{FLOOR[1]}.*/bin/{NAME}"))
    found += [f"/usr/bin/{NAME}", f"/usr/local/bin/{NAME}"]
    return found


def find_python39() -> str | None:
    explicit = os.environ.get(ENV)
    if explicit:
        version = _version(explicit)
        if version != FLOOR:
            pytest.fail(f"{ENV}={explicit} is not a working Python {FLOOR[0]}.{FLOOR[1]} (got {version})")
        return explicit
    return next((p for p in candidates() if Path(p).exists() and _version(p) == FLOOR), None)


@pytest.fixture(scope="module")
def python39() -> str:
    python = find_python39()
    if python is None:
        pytest.skip(f"no Python {FLOOR[0]}.{FLOOR[1]} interpreter found (looked at {', '.join(candidates())}); "
                    f"set {ENV}=/path/to/{NAME} to run the agent's floor test")
    return python


@pytest.fixture
def backend(python39: str, tmp_path: Path) -> Iterator[HilBackend]:
    host = HostConfig(name="floor", host="localhost", connection="local", engine="emulator", loopback=True,
                      python_interpreter=shlex.quote(python39), extra={"san_remote_tmp": str(tmp_path)})
    backend = HilBackend([host])
    try:
        yield backend
    finally:
        backend.close()


def test_the_agent_runs_on_python_3_9(backend: HilBackend, python39: str) -> None:
    (agent,) = backend.agents
    pid = agent.client.hello["pid"]
    assert isinstance(pid, int)
    assert Path(f"/proc/{pid}/exe").resolve() == Path(python39).resolve()  # not the controller's interpreter


def test_spi_calls_through_a_python_3_9_agent(backend: HilBackend) -> None:
    switch = Switch(backend)
    readme.run_example(switch, backend)
    switch.close_all()
    assert backend.leaks() == []

    conn = switch.connect()
    a, b = conn.local, conn.remote
    src = a.process.alloc(4096)
    handle = a.provider.register_memory(a.socket, src, Access.READ)
    dst = b.process.alloc(4096)

    # Refusals cross the wire with the contract's codes: bad access (R14), a READ window written (R6).
    with pytest.raises(SanError) as bad:
        a.provider.register_memory(a.socket, src, 4)
    assert bad.value.code is WsaError.WSAEINVAL
    read_only = b.provider.register_rdma_memory(b.socket, dst, Access.READ)
    refused = a.provider.rdma_write(a.socket, [(src, handle)], read_only, offset=0).wait(timeout=30)
    assert refused.status is Status.ACCESS_VIOLATION and refused.bytes == 0

    conn.close()
    assert backend.leaks() == []
