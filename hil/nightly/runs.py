"""Running ``san-hil nightly``'s pytest subprocesses: per host set the suite and the reference model, in
parallel, never two on one host.

``SetRun`` is one pytest run on a set (the suite or the model; its directory: pytest.log, junit.xml,
report.json, failures.json, report.html where pytest-html is installed, and how it ended); ``pytest_argv``
its command line; ``run_sets`` runs them all, ``jobs`` at a time. What they print is ASCII: nightly runs under
any locale (issue 12).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hil.nightly.plan import SUITE, HostSet

__all__ = ["FAIL", "MODEL", "NONE", "PASS", "SUITE", "SetRun", "pytest_argv", "run_sets"]

MODEL = "pytest_san.model"
# For summary.md only (written as UTF-8); the terminal gets words, whatever its encoding.
PASS, FAIL, NONE = "\u2713", "\u2717", "\u2013"  # check mark, ballot x, en dash
DEVIATING = "\u2260"  # not equal: failures a declared deviation explains


@dataclass
class SetRun:
    """One pytest run on a set (``kind``: the suite or the model): where its files go, and how it ended."""

    set: HostSet
    directory: Path
    kind: str = "suite"  # "suite" (pytest_san.scenarios, HostSet.suite) | "model" (pytest_san.model)
    argv: list[str] = field(default_factory=list)
    exit_status: int | None = None
    started: float = 0.0
    duration: float = 0.0

    @property
    def label(self) -> str:
        """The run's name in progress lines and junit.xml: the set's, plus "model" for the model run."""
        return self.set.name if self.kind == "suite" else f"{self.set.name} model"

    @property
    def junit(self) -> Path:
        return self.directory / "junit.xml"

    @property
    def report(self) -> Path:
        return self.directory / "report.json"

    @property
    def failures(self) -> Path:
        return self.directory / "failures.json"

    @property
    def log(self) -> Path:
        return self.directory / "pytest.log"

    @property
    def html(self) -> Path:
        """pytest-html's report of the run (index.html links each cell of its matrix to one)."""
        return self.directory / "report.html"


def _html_args(run: SetRun) -> list[str]:
    """pytest-html's options, where it is installed (the nightly extra has it): one self-contained page."""
    if importlib.util.find_spec("pytest_html") is None:
        return []
    return [f"--html={run.html}", "--self-contained-html"]


def pytest_argv(run: SetRun, inventory: Path, group: str, lease_timeout: float, extra: Sequence[str]) -> list[str]:
    targets = run.set.suite if run.kind == "suite" else (MODEL,)
    # Without the cache plugin, pytest would warn about an unknown cache_dir.
    cache = [] if "no:cacheprovider" in extra else ["-o", f"cache_dir={run.directory / '.pytest_cache'}"]
    return [sys.executable, "-m", "pytest", "--pyargs", *targets, "--san-backend=hil",
            f"--san-inventory={inventory}", f"--san-group={group}", f"--san-hosts={','.join(run.set.names)}",
            f"--san-hosts-per-worker={len(run.set.hosts)}", f"--san-lease-timeout={lease_timeout:g}",
            f"--san-report={run.report}", f"--junitxml={run.junit}", "-o", f"junit_suite_name={run.label}",
            *cache, "-p", "hil.plugin.nightly", f"--san-failures={run.failures}", *_html_args(run), *extra]


def run_sets(runs: Sequence[SetRun], jobs: int, say: Callable[[str], None],
             poll: float = 0.2) -> None:
    """Run every run's pytest, in order as hosts free up, ``jobs`` at a time, never two runs that share a
    host at once (a set's model waits for its suite)."""
    pending = list(runs)
    # pytest.log is a file we read as UTF-8: the children write it so, whatever the locale says.
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    running: dict[int, tuple[SetRun, subprocess.Popen[bytes]]] = {}
    try:
        while pending or running:
            in_use = {name for run, _ in running.values() for name in run.set.names}
            for run in list(pending):
                if len(running) >= jobs:
                    break
                if in_use.isdisjoint(run.set.names):
                    run.directory.mkdir(parents=True, exist_ok=True)
                    with run.log.open("wb") as log:
                        proc = subprocess.Popen(run.argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env)
                    run.started = time.monotonic()
                    running[proc.pid] = (run, proc)
                    pending.remove(run)
                    in_use.update(run.set.names)
                    say(f"nightly: {run.label}: running pytest (log: {run.log})")
            for pid, (run, proc) in list(running.items()):
                status = proc.poll()
                if status is not None:
                    run.exit_status = status
                    run.duration = time.monotonic() - run.started
                    del running[pid]
                    say(f"nightly: {run.label}: {_outcome_line(run)}")
            if pending or running:
                time.sleep(poll)
    except BaseException:
        for _, proc in running.values():
            proc.send_signal(signal.SIGINT)  # pytest ends its session (and the agents) cleanly
        for _, proc in running.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


def _outcome_line(run: SetRun) -> str:
    report = _load_json(run.report)
    report = report if isinstance(report, dict) else {}
    model = report.get("model")
    if run.kind == "model" and isinstance(model, dict):
        text = (f"{model.get('sequences', 0)} sequences, {model.get('steps', 0)} steps, "
                f"{len(model.get('divergences', []))} divergence(s), seed {_seeds(model)}")
    elif run.kind == "model":
        text = "no model result recorded"
    else:
        text = ", ".join(f"{n} {k}" for k, n in _totals(report).items() if n) or "no SAN tests recorded"
    mark = "ok:" if run.exit_status == 0 else f"FAILED (pytest exit {run.exit_status}):"
    return f"{mark} {text} in {run.duration:.1f} s"


def _seeds(model: Mapping[str, Any]) -> str:
    return ", ".join(str(seed) for seed in model.get("seeds", ())) or "unknown"


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _totals(report: Mapping[str, Any]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for test in report.get("tests", ()):
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    return counts
