"""docs/providers.md's five-minute examples, run as written from an empty directory: the files its ``python``
blocks name, then the commands of its ``console`` blocks, whose output must show the lines the docs show.

In a shown output, a line ``...`` stands for any lines and ``...`` within a line for any text; every other
line must appear, in order (issue 27: ``-p conftest`` failed as written and its output was out of date).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "providers.md"
BIN = Path(sys.executable).parent


def _section(title: str) -> str:
    """From the heading ``title`` to the next heading (outside code blocks)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(next(line for line in lines if line.startswith("#") and title in line))
    fenced, end = False, len(lines)
    for at in range(start + 1, len(lines)):
        fenced ^= lines[at].startswith("```")
        if not fenced and lines[at].startswith("#"):
            end = at
            break
    return "\n".join(lines[start:end]) + "\n"


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", section, flags=re.M | re.S)


def _files(section: str) -> dict[str, str]:
    """file name -> text, for each python block whose first line is ``# NAME.py``."""
    found = {}
    for block in _blocks(section, "python"):
        first = block.splitlines()[0]
        match = re.fullmatch(r"# (\w+\.py)", first)
        assert match, f"{DOC.name}: a python block of the example must start with '# NAME.py', not {first!r}"
        found[match.group(1)] = block
    return found


def _commands(section: str) -> list[tuple[list[str], list[str]]]:
    """(argv, the output lines shown) for each ``$`` line of the section's console blocks."""
    found: list[tuple[list[str], list[str]]] = []
    for block in _blocks(section, "console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((shlex.split(line[2:]), []))
            else:
                found[-1][1].append(line)
    assert found, f"{DOC.name}: no console block with a '$ command'"
    return found


def _pattern(shown: str) -> re.Pattern[str]:
    """``...`` matches any text, and a rule of ``===`` any width of it (pytest pads its lines to the terminal)."""
    parts = [re.sub(r"={3,}", "=+", re.escape(part)) for part in shown.split("...")]
    return re.compile(".*".join(parts))


def _unmatched(shown: list[str], output: list[str]) -> list[str]:
    """The shown lines (in order, ``...`` lines skipped) that the output lacks."""
    missing, at = [], 0
    for line in shown:
        if line.strip() in ("", "..."):
            continue
        pattern = _pattern(line)
        hit = next((i for i in range(at, len(output)) if pattern.fullmatch(output[i])), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing


def _run_example(tmp_path: Path, sections: list[str]) -> None:
    for section in sections:
        for name, text in _files(section).items():
            (tmp_path / name).write_text(text, encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    for argv, shown in _commands(sections[-1]):
        program = {"python": sys.executable, "san-hil": str(BIN / "san-hil")}.get(argv[0], argv[0])
        result = subprocess.run([program, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=900, check=False)
        output = result.stdout.splitlines()
        missing = _unmatched(shown, output)
        assert not missing, (f"{DOC.name}: `{shlex.join(argv)}` (exit {result.returncode}) no longer shows\n"
                             + "\n".join(missing) + "\n--- its output:\n" + result.stdout + result.stderr)
        assert result.returncode == 0, result.stdout + result.stderr


PROVIDER = "## A provider in five minutes"
MUTANTS = "### Your own bugs in five minutes"


def test_the_matcher_needs_every_shown_line_in_order() -> None:
    output = ["a", "R10  1  0  2", "SKIPPED [3] x/test_s.py:57: lacks it", "b"]
    assert _unmatched(["...", "R10  1  0  2", "SKIPPED [3] .../test_s.py:...: lacks it", "..."], output) == []
    assert _unmatched(["SKIPPED [3] .../test_s.py:...: lacks it", "R10  1  0  2"], output) == ["R10  1  0  2"]
    assert _unmatched(["R10  1  0  3"], output) == ["R10  1  0  3"]
    assert _unmatched(["===== 3 passed in ...s =====", "== b"], ["== 3 passed in 1.5s ===========", "== b"]) == []
    assert _unmatched(["===== 3 passed in ...s ====="], ["== 4 passed in 1.5s =="]) == ["===== 3 passed in ...s ====="]


@pytest.mark.whole_suite
@pytest.mark.parametrize("sections", [[PROVIDER], [PROVIDER, MUTANTS]], ids=["provider", "mutants-plugin"])
def test_the_five_minute_example_works_as_written(tmp_path: Path, sections: list[str]) -> None:
    example = tmp_path / "empty"
    example.mkdir()
    _run_example(example, [_section(title) for title in sections])
