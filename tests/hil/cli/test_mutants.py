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
    result = subprocess.run([sys.executable, "-m", "hil.cli", "mutants", "--out", str(out), *argv],
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
    assert data["mutants"] == {"read_descriptor_writable": {"failed": ["R6"], "breaks": ["R6"], "verdict": "caught",
                                                          "missed": [], "caught_under": "all"}}
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


# --- an author's own entries: --plugin ----------------------------------------------------------

MY_BUG = '''
"""RDMA registrations asked READ are made READWRITE: a peer may write them."""
from pytest_san import Access

BREAKS = ("R6",)


class WritableReads:
    def __init__(self, inner):
        self.inner = inner

    def register_rdma_memory(self, socket, buffer, access, descriptor_size=None):
        if access is Access.READ:
            access = Access.READWRITE
        return self.inner.register_rdma_memory(socket, buffer, access, descriptor_size)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def pytest_san_make_provider(config, node, provider):
    return WritableReads(provider)
'''

MY_LEGAL = '''
"""Forwards everything: a legal variant (no BREAKS)."""


class Same:
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


def pytest_san_make_provider(config, node, provider):
    return Same(provider)
'''


def test_an_authors_bug_and_legal_variant_run_instead_of_the_corpus(tmp_path: Path) -> None:
    (tmp_path / "my_bug.py").write_text(MY_BUG)
    (tmp_path / "my_legal.py").write_text(MY_LEGAL)
    result, data = _mutants(tmp_path, "--plugin", "my_bug", "--plugin", "my_legal", "--focus")
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["mutants"] == {"my_bug": {"failed": ["R6"], "breaks": ["R6"], "verdict": "caught",
                                                          "missed": [], "caught_under": "all"}}
    assert data["legal"] == {"my_legal": {"failed": []}}
    assert "1 of 1 applicable bugs caught" in result.stdout and "1 of 1 legal variants passed" in result.stdout
    assert "2 entries (2 from --plugin)" in result.stderr


def test_a_directory_of_plugins_with_the_corpus_and_only(tmp_path: Path) -> None:
    """Every module of a directory is an entry (not _* or conftest); --corpus adds the shipped entries and
    --only picks among both."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "my_bug.py").write_text(MY_BUG)
    (mine / "my_legal.py").write_text(MY_LEGAL)
    (mine / "_helpers.py").write_text("raise RuntimeError('not an entry')\n")
    (mine / "conftest.py").write_text("raise RuntimeError('not an entry')\n")
    result, data = _mutants(tmp_path, "--plugin", "mine", "--corpus", "--only", "my_bug,no_rdma_read", "--focus")
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(data["mutants"]) == ["my_bug"] and data["mutants"]["my_bug"]["verdict"] == "caught"
    assert data["legal"] == {"no_rdma_read": {"failed": []}}


def test_a_package_directory_imports_its_modules_as_the_packages(tmp_path: Path) -> None:
    package = tmp_path / "mybugs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "access.py").write_text(MY_BUG)
    (package / "again.py").write_text('from .access import pytest_san_make_provider\n\nBREAKS = ("R6")\n')
    result, data = _mutants(tmp_path, "--plugin", "mybugs", "--only", "mybugs.again", "--focus")
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["mutants"] == {"again": {"failed": ["R6"], "breaks": ["R6"], "verdict": "caught",
                                                          "missed": [], "caught_under": "all"}}


@pytest.mark.parametrize(("files", "argv", "message"), [
    ({"broken.py": "import no_such_package_here\n"}, ["--plugin", "broken"],
     "--plugin broken: cannot import broken: ModuleNotFoundError: No module named 'no_such_package_here'"),
    ({"wrong.py": MY_BUG.replace('("R6",)', '("R6", "R99", "read-only")')}, ["--plugin", "wrong"],
     "--plugin wrong: wrong.BREAKS names 'R99', 'read-only', not rule ids (known: R1, "),
    ({"bare.py": MY_BUG.replace('("R6",)', '("R 6")')}, ["--plugin", "bare.py"],
     "--plugin bare.py: bare.BREAKS names 'R 6', not rule ids"),
    ({"number.py": MY_BUG.replace('("R6",)', '6')}, ["--plugin", "number.py"],
     "--plugin number.py: number.BREAKS must be a tuple of rule ids such as ('R6',), got 6"),
    ({"nohook.py": "BREAKS = ()\n"}, ["--plugin", "nohook"], "--plugin nohook: nohook is no pytest plugin"),
    ({}, ["--plugin", "absent.py"], "--plugin absent.py: no such file"),
    ({"empty/README": ""}, ["--plugin", "empty"], "--plugin empty: a directory without modules"),
    ({"my_bug.py": MY_BUG}, ["--plugin", "my_bug", "--only", "no_rdma_read"],
     "no such entry among the --plugin modules: no_rdma_read (known: my_bug); with --plugin the shipped corpus "
     "runs only with --corpus"),
    ({"no_rdma_read.py": MY_LEGAL}, ["--plugin", "no_rdma_read", "--corpus"],
     "--plugin: no_rdma_read: the shipped corpus has an entry of that name"),
])
def test_a_bad_plugin_is_one_line_naming_it(tmp_path: Path, files: dict[str, str], argv: list[str],
                                            message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    result, data = _mutants(tmp_path, *argv)
    assert result.returncode == 2 and data == {}
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]], "one line, no traceback"
    assert result.stderr.startswith(f"san-hil mutants: {message}"), result.stderr


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_positive_number_is_refused(tmp_path: Path, value: str) -> None:
    result, data = _mutants(tmp_path, "--only", "no_rdma_read", f"--timeout={value}")
    assert result.returncode == 2 and data == {} and not (tmp_path / "out").exists()
    assert result.stderr.splitlines()[-1].startswith("san-hil mutants: error: argument --timeout: ")
    assert "Traceback" not in result.stderr
