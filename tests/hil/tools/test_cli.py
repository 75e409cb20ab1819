"""``san-hil`` itself: its version, its options, and what it refuses before doing anything."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

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
