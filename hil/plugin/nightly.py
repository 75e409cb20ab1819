"""A pytest plugin ``san-hil nightly`` loads into each of its runs (``-p hil.plugin.nightly``).

It writes every failed test phase, with the host diagnostics the hil plugin attached (sections named
``san host diagnostics: <host>``), to ``--san-failures PATH`` as JSON, for ``summary.md``. JUnit XML
keeps only captured output, not report sections, so this is how the diagnostics reach the summary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hil.plugin.diagnostics import DIAGNOSTICS_PREFIX

_TEXT_CHARS = 4000
_RECORDER = "san-nightly-failures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("san").addoption("--san-failures", metavar="PATH", default=None,
                                     help="write failed tests with their host diagnostics as JSON (san-hil nightly)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("san_failures")
    if path and not hasattr(config, "workerinput"):  # under xdist the controller hears every report
        config.pluginmanager.register(FailureRecorder(Path(config.invocation_params.dir, path)), _RECORDER)


def pytest_unconfigure(config: pytest.Config) -> None:
    recorder = config.pluginmanager.get_plugin(_RECORDER)
    if recorder is not None:
        config.pluginmanager.unregister(recorder)


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    lines = report.longreprtext.strip().splitlines()
    return lines[-1] if lines else ""


class FailureRecorder:
    """Collects failed phases; writes them at session end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failures: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed:
            return
        self.failures.append({
            "nodeid": report.nodeid,
            "when": report.when,
            "message": _message(report)[:_TEXT_CHARS],
            "longrepr": report.longreprtext[-_TEXT_CHARS:],
            "diagnostics": {name.removeprefix(DIAGNOSTICS_PREFIX): content
                            for name, content in report.sections if name.startswith(DIAGNOSTICS_PREFIX)},
        })

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.failures, indent=1) + "\n", encoding="utf-8")
