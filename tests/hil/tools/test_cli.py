"""``san-hil`` itself: its version, its options, and what it refuses before doing anything."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import pytest_san


def _san_hil(*argv: str, env: dict[str, str] | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``san-hil`` as a user runs it: the installed console script where there is one, else the module."""
    script = Path(sys.executable).with_name("san-hil")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "hil.tools.cli"]
    return subprocess.run([*command, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
                          check=False)


# --- --version ---------------------------------------------------------------------------------------


def test_version_is_the_packages() -> None:
    result = _san_hil("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"san-hil {pytest_san.__version__}\n"
    # one source: the installed distribution's metadata says the same
    assert pytest_san.__version__ == version("pytest-san")


# --- --hosts is a count (lab up/run); host names are --limit -------------------------------------------


def _two_local_hosts(tmp_path: Path) -> Path:
    path = tmp_path / "lab.json"
    host = {"ansible_connection": "local", "san_engine": "emulator", "san_remote_tmp": str(tmp_path)}
    path.write_text(json.dumps({"all": {"children": {"san": {"hosts": {"h1": host, "h2": host}}}}}))
    return path


def test_prepare_selects_hosts_with_limit(tmp_path: Path) -> None:
    inventory = _two_local_hosts(tmp_path)
    result = _san_hil("prepare", "--inventory", str(inventory), "--limit", "h2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("h2: ready") and "h1" not in result.stdout
    assert "--limit NAMES" in _san_hil("prepare", "--help").stdout


@pytest.mark.parametrize("command", [["prepare"], ["nightly", "--out", "nightly"]])
def test_hosts_with_names_is_refused_naming_limit(tmp_path: Path, command: list[str]) -> None:
    inventory = _two_local_hosts(tmp_path)
    result = _san_hil(*command, "--inventory", str(inventory), "--hosts", "h2", cwd=tmp_path)
    assert result.returncode == 2
    assert f"san-hil {command[0]}: error: --hosts is not an option of this command: use --limit h2" in result.stderr
    assert result.stdout == "" and not (tmp_path / "nightly").exists()  # nothing ran
    assert "--hosts" not in _san_hil(command[0], "--help").stdout


def test_nightly_limit_selects_from_the_inventory(tmp_path: Path) -> None:
    inventory = _two_local_hosts(tmp_path)
    result = _san_hil("nightly", "--inventory", str(inventory), "--out", str(tmp_path / "out"), "--limit", "h3")
    assert result.returncode == 2
    assert "host 'h3' is not in group 'san'; its hosts: h1, h2" in result.stderr
