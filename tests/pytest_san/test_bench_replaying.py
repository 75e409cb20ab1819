"""benchmarks/replaying.py, which ``benchmarks/lab.py`` uses to compare the model's time per sequence across
trees: it writes the seconds a run spent replaying its regressions, and those are part of the run's own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_regressions_replay_is_timed_apart(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    out = pytester.path / "replaying.json"
    report = pytester.path / "report.json"
    monkeypatch.setenv("SAN_BENCH_REPLAYING_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "replaying", "--pyargs",
                                           "pytest_san.model", "--san-model-sequences=2", "--san-model-steps=5",
                                           "--san-model-seed=1", f"--san-report={report}")
    result.assert_outcomes(passed=1)
    replayed = json.loads(out.read_text())["seconds"]
    model = json.loads(report.read_text())["model"]
    assert model["regressions"] > 0 and 0 < replayed <= model["seconds"]
    assert any(f"replaying {model['regressions']} regressions first" in cost for cost in model["costs"])


def test_without_its_variable_it_changes_nothing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAN_BENCH_REPLAYING_OUT", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "replaying", "--pyargs",
                                           "pytest_san.model", "--san-model-sequences=1", "--san-model-steps=5")
    result.assert_outcomes(passed=1)
    assert not list(pytester.path.glob("*.json"))
