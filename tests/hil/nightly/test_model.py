"""``san-hil nightly`` runs the reference model per host set, reports it, and survives an ASCII locale.

The hosts are emulator-engine agents over the local transport (no sshd, no lab): two names, so two host
sets and two leases. Budgets are tiny; the planted divergence is pytest_san.examples.broken_provider
(it widens an RDMA registration's access, which the model sees in the registrations at once).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hil.cli.console import print_safely
from hil.cli.main import main
from hil.inventory import HostConfig
from hil.nightly.model import ModelOptions, model_args, plugin_args
from hil.nightly.plan import HostSet
from hil.nightly.runs import SetRun, run_sets
from tests.support.lab_hosts import pytest_env, write_inventory

NAMES = ("nmodelA", "nmodelB")
SUITE_TEST = "test_handle_works_in_its_own_process"  # one suite test: these tests are about the model


def _inventory(tmp_path: Path) -> Path:
    remote = tmp_path / "remote-tmp"
    remote.mkdir()
    hosts = [HostConfig(name=name, host="localhost", connection="local", engine="emulator", loopback=True,
                        python_interpreter=sys.executable, extra={"san_remote_tmp": str(remote)})
             for name in NAMES]
    return write_inventory(tmp_path / "lab.json", hosts)


# --- the budget and the arguments -------------------------------------------------------------------------


def test_the_default_budget_is_2000_sequences_of_20_steps_split_over_the_sets() -> None:
    options = ModelOptions()
    assert (options.sequences, options.steps) == (2000, 20)
    assert [options.per_set(n) for n in (1, 2, 3, 7)] == [2000, 1000, 667, 286]
    assert all(options.per_set(n) * n >= 2000 for n in range(1, 50))
    args = model_args(ModelOptions(deadline=90, seed=4, differential=True), 667,
                      ["-p", "my_provider", "-k", "R1", "tests/test_x.py", "-pno:cacheprovider"])
    assert args == ["--san-model-sequences=667", "--san-model-steps=20", "--san-model-deadline=90",
                    "--san-model-seed=4", "--san-model-differential", "-p", "my_provider", "-pno:cacheprovider"]
    assert plugin_args(["-k", "x", "-p"]) == []


def test_bad_model_options_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _inventory(tmp_path)
    for bad in (["--model-sequences", "0"], ["--model-steps", "-1"], ["--model-deadline", "0"]):
        assert main(["nightly", "--inventory", str(inventory), "--out", str(tmp_path / "out"), *bad]) == 2
        assert "must be" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_set_s_runs_never_overlap_and_other_sets_run_beside_them(tmp_path: Path) -> None:
    sets = [HostSet((HostConfig(name=name, host="localhost"),)) for name in NAMES]
    runs = [SetRun(hs, tmp_path / hs.slug / kind, kind=kind) for kind in ("suite", "model") for hs in sets]
    for run in runs:
        run.argv = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    run_sets(runs, jobs=2, say=lambda line: None, poll=0.02)
    spans = {(run.set.name, run.kind): (run.started, run.started + run.duration) for run in runs}
    for name in NAMES:
        assert spans[name, "suite"][1] <= spans[name, "model"][0]  # the model after its set's suite
    assert spans[NAMES[0], "suite"][0] < spans[NAMES[1], "suite"][1]  # the two sets at once
    assert all(run.exit_status == 0 for run in runs)


def test_print_safely_escapes_what_an_ascii_terminal_cannot_show() -> None:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    print_safely("nightly: \u2713 passed", stream)
    assert raw.getvalue() == b"nightly: \\u2713 passed\n"
    stream.close()
    print_safely("after close", stream)  # a closed stream is not worth losing the results over


# --- the command ---------------------------------------------------------------------------------------


def test_nightly_runs_the_model_on_each_host_set_and_reports_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS")):  # not for the nested pytest runs
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "nightly"
    status = main(["nightly", "--inventory", str(_inventory(tmp_path)), "--out", str(out),
                   "--model-sequences", "5", "--model-steps", "10", "--model-seed", "5",
                   "--", "-p", "no:cacheprovider", "-k", SUITE_TEST])
    said = capsys.readouterr().err  # progress: san-hil's log handler, on stderr
    assert status == 0, said + "".join(p.read_text() for p in out.glob("hosts/**/pytest.log"))

    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "passed" and report["model_note"] is None
    model = report["model"]
    # 5 sequences in all over two sets: ceil(5 / 2) = 3 each.
    assert (model["status"], model["sequences"], model["steps"], model["divergences"]) == ("passed", 6, 60, 0)
    assert model["budget"] == {"sequences": 5, "per_set": 3, "steps": 10, "deadline": None, "seed": 5,
                               "differential": False}
    for name in NAMES:
        entry = model["sets"][name]
        assert (entry["hosts"], entry["status"], entry["backend"], entry["sequences"], entry["steps"]) == (
            [name], "passed", "hil", 3, 30)
        assert entry["seed"] == 5 and entry["divergences"] == [] and entry["regressions"] > 0
        assert f"--san-hosts={name} --san-model-seed=5 --san-model-sequences=3" in entry["replay"]
        own = json.loads((out / "hosts" / name / "model" / "report.json").read_text())
        assert own["model"]["sequences"] == 3  # the run's own report, beside the suite's
        # The suite, then the model, on the same host: their leases do not overlap.
        suite_lease = report["hosts"][name]["leases"][0]
        (model_lease,) = own["leases"]
        assert suite_lease["end"] <= model_lease["start"]
        assert f"nightly: {name} model: ok: 3 sequences, 30 steps, 0 divergence(s), seed 5" in said

    suites = ET.parse(out / "junit.xml").getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == [*NAMES, *(f"{n} model" for n in NAMES)]

    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert ("**Suite**: \u2713 passed on all 2 host set(s) \u00b7 **Model**: \u2713 no divergence in 6 sequences, "
            "60 steps") in summary
    assert "## Reference model: \u2713 no divergence" in summary
    assert "(2 host set(s); budget 3 sequences of 10 steps each)" in summary
    for name in NAMES:
        assert f"| **{name}** | \u2713 passed | hil | 3 | 30 | 0 | `5` |" in summary
    assert "nightly: model: passed: 6 sequences, 60 steps, 0 divergence(s)" in said


def test_without_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS")):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="hil.nightly.job")
    out = tmp_path / "nightly"
    status = main(["nightly", "--inventory", str(_inventory(tmp_path)), "--out", str(out), "--no-model",
                   "--", "-p", "no:cacheprovider", "-k", SUITE_TEST])
    said = capsys.readouterr()
    assert status == 0, said.err
    # Nightly's progress is records of its logger (so log_cli, --log-file or any handler see it); the
    # terminal lines are what san-hil's handler made of them, on stderr, and stdout stays empty.
    progress = [r.getMessage() for r in caplog.records if r.name == "hil.nightly.job"]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "hil.nightly.job")
    assert progress[0].startswith("nightly: 2 host set(s) from ") and "no model (--no-model)" in progress[0]
    for name in NAMES:
        assert any(line.startswith(f"nightly: {name}: ok: 1 passed in ") for line in progress), progress
    assert progress[-1].startswith("nightly: passed: wrote ")
    shown = [re.sub(r"^\[ *\d+\.\ds\] ", "", line) for line in said.err.splitlines()]
    assert [line for line in shown if line.startswith("nightly: ")] == progress
    assert said.out == ""
    report = json.loads((out / "report.json").read_text())
    assert report["model"] is None and "--no-model" in report["model_note"]
    assert not list(out.glob("hosts/*/model"))
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "**Model**: not run (--no-model)" in summary and "## Reference model\n\nNot run (--no-model)." in summary


def test_a_planted_divergence_fails_nightly_and_reads_well_under_an_ascii_locale(tmp_path: Path) -> None:
    # Issue 12: under LC_ALL=C with ASCII stdio, nightly once crashed printing a check mark after the
    # tests ran and wrote nothing. Issue 11: a model divergence is a failure, shown with its steps.
    out = tmp_path / "nightly"
    env = {**pytest_env(), "LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(
        [sys.executable, "-m", "hil.cli", "nightly", "--inventory", str(_inventory(tmp_path)), "--out", str(out),
         "--model-sequences", "2", "--model-seed", "1",  # one sequence on each set
         "--", "-p", "no:cacheprovider", "-p", "pytest_san.examples.broken_provider", "-k", SUITE_TEST],
        cwd=tmp_path, env=env, capture_output=True, timeout=600)
    said = done.stderr.decode("ascii")  # nothing but ASCII on the terminal; progress is on stderr
    assert done.returncode == 1, said
    assert "Traceback" not in said and "Logging error" not in said and done.stdout == b""
    said = "\n".join(re.sub(r"^\[ *\d+\.\ds\] ", "", line) for line in said.splitlines())  # the elapsed time
    for name in NAMES:  # the suite's one test passed ("ok" where a check mark crashed), the model did not
        assert f"nightly: {name}: ok: 1 passed" in said
        assert f"nightly: {name} model: FAILED (pytest exit 1): 1 sequences" in said
    assert said.rstrip().splitlines()[-1].startswith("nightly: failed: wrote ")

    report = json.loads((out / "report.json").read_bytes().decode("ascii"))
    assert report["status"] == "failed" and all(e["status"] == "passed" for e in report["hosts"].values())
    model = report["model"]
    assert model["status"] == "failed" and model["divergences"] == 4  # R6 and R7 on each set
    for name in NAMES:
        entry = model["sets"][name]
        assert (entry["status"], entry["seed"]) == ("diverged", 1)
        div, other = entry["divergences"]
        # Each rule it breaks is its own divergence: R7 found already by the replayed regressions (one registers a
        # WRITE descriptor), before any sequence; R6 by a sequence.
        assert (div["rules"], other["rules"], other["kind"]) == (["R7"], ["R6"], "model")
        assert (div["kind"], div["side"], div["category"], div["step"]) == ("regression", "hil", "registrations",
                                                                            "Register(rdma)")
        assert any("register_rdma_memory(" in line and "-> hil: descriptor" in line for line in div["steps"])
        assert "--san-model-seed=1" in entry["replay"] and "-p pytest_san.examples.broken_provider" in entry["replay"]
        assert list(entry["diagnostics"]) == [name] and "rdma link show" in entry["diagnostics"][name]
    assert ET.parse(out / "junit.xml").getroot().get("failures") == "2"

    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith("# pytest-san nightly: \u2717 FAILED\n")
    assert "**Suite**: \u2713 passed on all 2 host set(s) \u00b7 **Model**: \u2717 4 divergence(s)" in summary
    assert f"## Reference model: \u2717 4 divergence(s) on {NAMES[0]}, {NAMES[1]}" in summary
    assert f"| **{NAMES[0]}** | \u2717 diverged | hil | 1 |" in summary
    section = summary.split(f"### {NAMES[0]}: divergence 1 of 2", 1)[1]
    assert section.lstrip().startswith("**hil: registrations after a Register(rdma) step (a past divergence replayed")
    assert "> registrations of s" in section and "the provider has" in section and "the model [" in section
    steps = section.split("```text\n", 1)[1].split("```", 1)[0]
    assert steps.startswith("  setup: p0 = ") and "  1. s" in steps and "(the model: descriptor)" in steps
    assert "Replay: `pytest --pyargs pytest_san.model --san-backend=hil" in section
    assert f"<summary>host diagnostics: {NAMES[0]}</summary>" in section
