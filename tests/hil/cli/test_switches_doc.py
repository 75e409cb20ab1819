"""docs/switches.md's five-minute example, run as written from an empty directory: its files, then its commands,
whose output must show the lines the docs show (the matcher of ``test_providers_doc``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .test_providers_doc import BIN, _commands, _files, _unmatched

DOC = Path(__file__).resolve().parents[3] / "docs" / "switches.md"


def _section(title: str) -> str:
    """From the heading ``title`` to the next heading (outside code blocks)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and title in line)
    fenced, end = False, len(lines)
    for at in range(start + 1, len(lines)):
        fenced ^= lines[at].startswith("```")
        if not fenced and lines[at].startswith("#"):
            end = at
            break
    return "\n".join(lines[start:end]) + "\n"


def _run_example(tmp_path: Path, section: str) -> None:
    for name, text in _files(section).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    for argv, shown in _commands(section):
        program = {"python": sys.executable, "san-hil": str(BIN / "san-hil")}.get(argv[0], argv[0])
        result = subprocess.run([program, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=900, check=False)
        missing = _unmatched(shown, result.stdout.splitlines())
        assert not missing, (f"{DOC.name}: `{shlex.join(argv)}` (exit {result.returncode}) no longer shows\n"
                             + "\n".join(missing) + "\n--- its output:\n" + result.stdout + result.stderr)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.whole_suite
def test_the_five_minute_switch_example_works_as_written(tmp_path: Path) -> None:
    example = tmp_path / "empty"
    example.mkdir()
    _run_example(example, _section("## A switch in five minutes"))
