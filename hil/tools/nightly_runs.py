"""Running ``san-hil nightly``'s pytest subprocesses: one per host set, in parallel, never two on one host.

``SetRun`` is one set's run (its directory: pytest.log, junit.xml, report.json, failures.json, and
how it ended); ``pytest_argv`` its command line; ``run_sets`` runs them all, ``jobs`` at a time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hil.tools.nightly_plan import HostSet

__all__ = ["FAIL", "NONE", "PASS", "SUITE", "SetRun", "pytest_argv", "run_sets"]

SUITE = "pytest_san.scenarios"
PASS, FAIL, NONE = "\u2713", "\u2717", "\u2013"  # check mark, ballot x, en dash


@dataclass
class SetRun:
    """One set's pytest run: where its files go, and how it ended."""

    set: HostSet
    directory: Path
    argv: list[str] = field(default_factory=list)
    exit_status: int | None = None
    started: float = 0.0
    duration: float = 0.0

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


def pytest_argv(run: SetRun, inventory: Path, group: str, lease_timeout: float, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", SUITE, "--san-backend=hil",
            f"--san-inventory={inventory}", f"--san-group={group}", f"--san-hosts={','.join(run.set.names)}",
            f"--san-hosts-per-worker={len(run.set.hosts)}", f"--san-lease-timeout={lease_timeout:g}",
            f"--san-report={run.report}", f"--junitxml={run.junit}", "-o", f"junit_suite_name={run.set.name}",
            "-o", f"cache_dir={run.directory / '.pytest_cache'}",
            "-p", "hil.plugin.nightly", f"--san-failures={run.failures}", *extra]


def run_sets(runs: Sequence[SetRun], jobs: int, say: Callable[[str], None],
             poll: float = 0.2) -> None:
    """Run every set's pytest, ``jobs`` at a time, never two sets that share a host at once."""
    pending = list(runs)
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
                                                stdin=subprocess.DEVNULL)
                    run.started = time.monotonic()
                    running[proc.pid] = (run, proc)
                    pending.remove(run)
                    in_use.update(run.set.names)
                    say(f"nightly: {run.set.name}: running pytest (log: {run.log})")
            for pid, (run, proc) in list(running.items()):
                status = proc.poll()
                if status is not None:
                    run.exit_status = status
                    run.duration = time.monotonic() - run.started
                    del running[pid]
                    say(f"nightly: {run.set.name}: {_outcome_line(run)}")
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
    counts = _totals(report) if isinstance(report, dict) else None
    text = ", ".join(f"{n} {k}" for k, n in (counts or {}).items() if n) or "no SAN tests recorded"
    mark = PASS if run.exit_status == 0 else f"{FAIL} pytest exit {run.exit_status}:"
    return f"{mark} {text} in {run.duration:.1f} s"


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
