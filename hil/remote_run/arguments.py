"""The pytest (or ``san-hil mutants``) arguments of a remote run, read for what crosses the long hop: the local files
they name (pushed beside the run), the reports they ask for (brought back) and the inventory (rewritten)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INVENTORY_NAME",
    "PUSH_LIMIT",
    "REPORTS_DIR",
    "Report",
    "RunArguments",
    "RunError",
    "read_arguments",
    "with_inventory",
]

INVENTORY_NAME = "lab-inventory.json"  # the rewritten inventory, in the run's directory on the host
REPORTS_DIR = ".san-reports"  # where the reports are written on the host, one directory per report asked for
PUSH_LIMIT = 64 << 20  # bytes of local files a run pushes at most (a test tree, not a data set)

# Options whose value is a file (or directory) the command writes: brought back to the path given.
PYTEST_REPORTS = ("--san-report", "--junitxml", "--junit-xml", "--html")
MUTANTS_REPORTS = ("--out",)
MUTANTS_DEFAULT_OUT = "mutants"  # san-hil mutants' --out default
INI_FILES = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "conftest.py")
SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".tox", ".nox", ".venv", "venv", ".pytest_cache",
                          ".mypy_cache", ".ruff_cache", "node_modules", ".hypothesis"})


class RunError(Exception):
    """A remote run that cannot go ahead as asked: the message says why, on one line."""


@dataclass(frozen=True)
class Report:
    """A report the command asked for: written on the host under ``slot``, brought back beside ``local``."""

    option: str
    local: Path  # absolute, on the user's side
    slot: str  # REPORTS_DIR/<n>: the host's directory for it, everything in it lands in local's directory

    @property
    def remote(self) -> str:
        """The path the command on the host is given, relative to its working directory."""
        return f"{self.slot}/{self.local.name}"


@dataclass(frozen=True)
class RunArguments:
    """What the host runs and what goes with it."""

    argv: tuple[str, ...]  # the arguments as the host's command gets them
    reports: tuple[Report, ...]
    files: Mapping[str, bytes]  # relative path -> content: the local files named, pushed beside the run
    inventory: Path | None  # the inventory the arguments named (--san-inventory, mutants' --inventory)
    requirements: tuple[str, ...]  # pytest plugins the arguments need on the host (pytest-html, pytest-xdist)


def read_arguments(args: Sequence[str], cwd: Path, *, mutants: bool = False) -> RunArguments:
    """Read ``args`` (what followed ``--``) as run from ``cwd``: report paths become the host's, the inventory
    option is taken out (the runner puts the rewritten one in), local files are collected."""
    report_options = MUTANTS_REPORTS if mutants else PYTEST_REPORTS
    inventory_options = ("--inventory",) if mutants else ("--san-inventory",)
    argv: list[str] = []
    reports: list[Report] = []
    inventory: Path | None = None
    pushed: list[Path] = []
    words = list(args)
    # ``san-hil mutants`` passes what follows its own ``--`` to pytest: those words are not its options, and what
    # this adds (the default --out) goes before them.
    end = words.index("--") if mutants and "--" in words else len(words)
    words, passed = words[:end], words[end:]
    i = 0
    while i < len(words):
        word = words[i]
        option, equals, value = word.partition("=")
        takes_value = option in report_options or option in inventory_options
        if takes_value and not equals:
            if i + 1 >= len(words):
                raise RunError(f"{option} needs a value")
            value = words[i + 1]
            i += 1
        i += 1
        if option in report_options and takes_value:
            report = Report(option, (cwd / value).resolve(), f"{REPORTS_DIR}/{len(reports)}")
            reports.append(report)
            argv.append(f"{option}={report.remote}")
            continue
        if option in inventory_options and takes_value:
            inventory = (cwd / value).resolve()
            continue
        argv.append(_local_path(word, cwd, pushed))
    if mutants and not any(r.option == "--out" for r in reports):
        report = Report("--out", (cwd / MUTANTS_DEFAULT_OUT).resolve(), f"{REPORTS_DIR}/{len(reports)}")
        reports.append(report)
        argv.append(f"--out={report.remote}")
    argv += [_local_path(word, cwd, pushed) for word in passed]
    return RunArguments(tuple(argv), tuple(reports), _collect(pushed, cwd), inventory, _plugins(args))


def _local_path(word: str, cwd: Path, pushed: list[Path]) -> str:
    """``word`` as the host gets it; a local file or directory it names (``x.py``, ``x.py::test``, ``--opt=x``)
    noted for pushing, an absolute one under ``cwd`` made relative."""
    prefix, equals, value = word.partition("=") if word.startswith("-") else ("", "", word)
    if word.startswith("-") and not equals:
        return word
    path_text, colons, rest = value.partition("::")
    if not path_text:
        return word
    path = Path(path_text)
    full = path if path.is_absolute() else cwd / path
    try:
        exists = full.exists()
    except OSError:  # a name too long to be a path: a -k expression, a test id
        return word
    if not exists:
        return word
    resolved = full.resolve()
    try:
        relative = resolved.relative_to(cwd.resolve())
    except ValueError:
        raise RunError(f"{path_text} is outside the current directory {cwd}: a remote run pushes files from "
                       "under it (run san-hil from a directory that holds them)") from None
    pushed.append(resolved)
    shown = relative.as_posix() if path.is_absolute() else path_text
    return f"{prefix}{equals}{shown}{colons}{rest}"


def _collect(paths: Sequence[Path], cwd: Path) -> dict[str, bytes]:
    """The files of ``paths`` (directories walked, caches skipped), the ini files and conftest.py files pytest
    reads on the way to them, by their path relative to ``cwd``."""
    root = cwd.resolve()
    found: set[Path] = {root / name for name in INI_FILES if (root / name).is_file()}
    for path in paths:
        for parent in path.parents:
            if parent == root or root not in parent.parents:
                break
            if (parent / "conftest.py").is_file():
                found.add(parent / "conftest.py")
        if path.is_dir():
            found.update(p for p in path.rglob("*") if p.is_file() and not SKIPPED_DIRS.intersection(
                p.relative_to(path).parts[:-1]) and p.suffix not in (".pyc", ".pyo"))
        elif path.is_file():
            found.add(path)
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(found):
        data = path.read_bytes()
        total += len(data)
        if total > PUSH_LIMIT:
            raise RunError(f"the files the arguments name come to more than {PUSH_LIMIT >> 20} MiB (at {path}): "
                           "name the test files or directories, not a whole tree of data")
        files[path.relative_to(root).as_posix()] = data
    return files


def _plugins(args: Sequence[str]) -> tuple[str, ...]:
    """The pytest plugins ``args`` use that pytest-san does not bring: their wheels go into the wheelhouse."""
    needed: list[str] = []
    if any(a == "--html" or a.startswith("--html=") for a in args):
        needed.append("pytest-html>=4")
    xdist = ("-n", "--numprocesses", "--dist", "--tx", "--maxprocesses")
    if any(a.partition("=")[0] in xdist or (a.startswith("-n") and a[2:].isdigit()) for a in args):
        needed.append("pytest-xdist>=3")
    return tuple(needed)


def with_inventory(argv: Sequence[str], *, mutants: bool) -> tuple[str, ...]:
    """``argv`` given the rewritten inventory (and, for pytest, the hil backend unless another is named)."""
    if mutants:
        return ("--inventory", INVENTORY_NAME, *argv)
    backend = () if any(a.partition("=")[0] == "--san-backend" for a in argv) else ("--san-backend=hil",)
    return (*backend, f"--san-inventory={INVENTORY_NAME}", *argv)

