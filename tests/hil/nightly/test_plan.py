"""What each of ``san-hil nightly``'s runs collects (hil/nightly/plan.py): rsockets' observed scenarios
run nightly on every verbs host set beside the suite (CI leaves them out: docs/ci.md), never on an emulator host
nor in the model's run."""

from __future__ import annotations

from pathlib import Path

import pytest

from hil.inventory import HostConfig
from hil.nightly.plan import OBSERVED, SUITE, host_sets
from hil.nightly.runs import MODEL, SetRun, pytest_argv


def _host(name: str, engine: str = "verbs") -> HostConfig:
    return HostConfig(name=name, host="10.0.0.1", engine=engine)  # type: ignore[arg-type]


def _collected(argv: list[str]) -> list[str]:
    start = argv.index("--pyargs") + 1
    return argv[start:argv.index("--san-backend=hil")]


def test_a_verbs_pair_runs_rsockets_observed_scenarios_beside_the_suite(tmp_path: Path) -> None:
    emulator, verbs = host_sets([_host("emu", "emulator"), _host("lab1"), _host("lab2")])
    assert verbs.suite == (SUITE, OBSERVED) and emulator.suite == (SUITE,)
    assert OBSERVED == "pytest_san.observed_scenarios"
    argv = pytest_argv(SetRun(verbs, tmp_path), tmp_path / "lab.yaml", "all", 60.0, [])
    assert _collected(argv) == ["pytest_san.scenarios", "pytest_san.observed_scenarios"]
    assert "--san-hosts=lab1,lab2" in argv


def test_neither_an_emulator_host_nor_the_model_runs_them(tmp_path: Path) -> None:
    emulator, verbs = host_sets([_host("emu", "emulator"), _host("lab1"), _host("lab2")])
    assert _collected(pytest_argv(SetRun(emulator, tmp_path), tmp_path / "i.yaml", "all", 60.0, [])) == [SUITE]
    model = SetRun(verbs, tmp_path, kind="model")
    assert _collected(pytest_argv(model, tmp_path / "i.yaml", "all", 60.0, [])) == [MODEL]


def test_the_nightly_script_runs_them_and_the_hang_on_every_lab() -> None:
    """.ci/nightly's labs reach the observed scenarios through ``san-hil nightly`` on each lab's inventory, and
    run the rclose hang's reproducer there; .ci/run (CI) runs neither, only NVMe-oF's exposure check (the rogue's
    two reads with register_always=N)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".ci").is_dir():  # tox runs the tests in the unpacked sdist, which ships no CI scripts
        pytest.skip(f"{root} is no checkout: no .ci/ to read")
    script = (root / ".ci" / "nightly").read_text()
    assert 'san-hil nightly --inventory "$inventory"' in script and "for provider in" in script
    assert "san-hil lab reproduce rsockets-rclose-live-riomap --state-dir '$lab_dir/state'" in script
    ci = (root / ".ci" / "run").read_text()
    assert "rsockets-rclose-live-riomap" not in ci
    runs = [line for line in ci.splitlines() if f"--pyargs {OBSERVED}" in line]  # the runs, not the check
    assert len(runs) == 1 and "-k \"nvme and (past or dead)\" --san-nvme-register-always=N" in ci
    assert "python -m pytest_san.observed_scenarios.nvme_exposure lab-nvme-exposure.json" in ci
    assert "--san-nvme-register-always=N" in script and "pytest_san.observed_scenarios.nvme_exposure" in script
