"""The lab's tools are found as a new user runs san-hil: by its full path from a venv that is not on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hil.lab import LabError
from hil.lab.guest import find_vng
from hil.lab.tools import env_with, find_tool


def _tool(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return tool


def test_a_tool_beside_the_interpreter_is_found_without_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    vng = _tool(venv_bin, "vng")
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))  # a venv's python, not resolved
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert find_tool("vng") == str(vng) == find_vng()
    on_path = _tool(tmp_path / "elsewhere", "vng")
    assert find_tool("vng") == str(on_path)  # PATH first, as a shell would
    env = env_with(str(vng), {"PATH": "/usr/bin:/bin"})
    assert env["PATH"] == f"{venv_bin}:/usr/bin:/bin"  # what vng runs of its own is found the same way
    assert env_with(str(vng), env)["PATH"] == env["PATH"]
    assert env_with("vng", {"PATH": "/bin"})["PATH"] == "/bin"  # a bare name: no "." put on PATH


def test_no_vng_anywhere_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(tmp_path / "scripts"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(LabError) as err:
        find_vng()
    assert str(err.value) == (f"vng not found on PATH nor in {tmp_path / 'bin'}, {tmp_path / 'scripts'}: pip install "
                              "virtme-ng (the project's `lab` extra) into this Python's environment")


def test_this_venvs_vng_is_found_with_a_bare_path() -> None:
    """The probe of issue 28: this environment's interpreter by its full path, PATH without its bin."""
    vng = Path(sys.executable).with_name("vng")
    if not vng.exists():
        pytest.skip(f"virtme-ng is not installed beside {sys.executable} (the lab extra)")
    done = subprocess.run([sys.executable, "-c", "from hil.lab.guest import find_vng; print(find_vng())"],
                          env={**os.environ, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(vng)
