"""``san-hil mutants``: the suite against entries of the mutation corpus, its verdicts, JSON and exit status.

Each case runs the real command on the emulator (one pytest subprocess per entry and one for the baseline),
with ``--only`` a few entries; the whole corpus runs in CI (.ci/run) and nightly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_san.mutants import corpus, select
from pytest_san.report import RULE_IDS

# A plugin for the suite's runs: the nodes have no fault injection (as on a lab host).
WITHOUT_FAULTS = """
def pytest_san_node_capabilities(config, node, capabilities):
    capabilities.discard("faults")
"""


def _mutants(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "hil.tools.cli", "mutants", "--out", str(out), *argv],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False)
    path = out / "mutants.json"
    return result, (json.loads(path.read_text()) if path.exists() else {})


def test_the_corpus_is_big_enough_and_breaks_every_rule() -> None:
    entries = corpus()
    bugs = [e for e in entries if not e.legal]
    assert len(bugs) >= 30 and len(entries) - len(bugs) >= 6
    assert {rule for e in bugs for rule in e.breaks} == set(RULE_IDS)
    assert all(e.summary for e in entries), "every entry's docstring says what it is"


def test_a_bug_is_caught_and_a_legal_variant_passes(tmp_path: Path) -> None:
    result, data = _mutants(tmp_path, "--only", "read_descriptor_writable,no_rdma_read")
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["backend"] == "emulator" and data["baseline"] == {"failed": []}
    assert data["mutants"] == {"read_descriptor_writable": {"failed": ["R6"], "breaks": ["R6"], "verdict": "caught"}}
    assert data["legal"] == {"no_rdma_read": {"failed": []}}
    assert "read_descriptor_writable" in result.stdout and "1 of 1 applicable bugs caught" in result.stdout
    assert (tmp_path / "out" / "read_descriptor_writable.json").exists()


def test_a_bug_the_backend_cannot_show_is_not_applicable(tmp_path: Path) -> None:
    (tmp_path / "without_faults.py").write_text(WITHOUT_FAULTS)
    result, data = _mutants(tmp_path, "--only", "out_of_memory_recoded", "--", "-p", "without_faults")
    assert result.returncode == 0, result.stdout + result.stderr
    line = data["mutants"]["out_of_memory_recoded"]
    assert line["verdict"] == "not-applicable" and line["lacking"] == ["faults"]


def test_a_bug_nothing_checked_survives_and_fails_the_run(tmp_path: Path) -> None:
    result, data = _mutants(tmp_path, "--only", "access_widened_rdma", "--", "-k", "test_device_object_has_direct_io")
    assert result.returncode == 1
    assert data["mutants"]["access_widened_rdma"]["verdict"] == "survived"
    assert "access_widened_rdma: survived" in result.stdout


def test_a_suite_that_fails_without_any_entry_fails_the_run(tmp_path: Path) -> None:
    result, data = _mutants(tmp_path, "--only", "no_rdma_read", "--", "-p", "pytest_san.examples.broken_provider")
    assert result.returncode == 1
    assert data["baseline"]["failed"] == ["R6", "R7"]
    assert "the suite fails R6, R7 without any entry" in result.stdout


def test_an_unknown_entry_is_refused_by_name(tmp_path: Path) -> None:
    result, data = _mutants(tmp_path, "--only", "no_rdma_read,no_such_bug")
    assert result.returncode == 2 and data == {}
    assert "no such entry in the mutation corpus: no_such_bug" in result.stderr


@pytest.mark.parametrize("name", [e.name for e in corpus()])
def test_every_entry_loads_as_a_plugin(name: str, pytester: pytest.Pytester) -> None:
    """Each entry is a plugin pytest can load by its module name, and implements at least one of the hooks."""
    (entry,) = select([name])
    pytester.makepyfile("def test_backend(san_backend): pass")
    pytester.runpytest("-p", entry.module).assert_outcomes(passed=1)
