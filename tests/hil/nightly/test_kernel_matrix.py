"""``san-hil matrix DIR``: the kernel x provider table from a night's labs, and ``san-hil lab reproduce``'s
command and verdicts where there is no RDMA device (on a lab: docs/providers.md's kernel table)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hil.cli.main import main
from hil.lab.reproduce import remote_command
from hil.nightly.kernel_matrix import cells, render


def _lab(directory: Path, name: str, release: str, *, failed: int = 0, findings: int = 0,
         alternatives: dict[str, int] | None = None, harness: float = 0.11, perftest: float = 0.07) -> None:
    folder = directory / name
    folder.mkdir(parents=True)
    rules = {"R1": {"passed": 7, "failed": 0, "skipped": 0, "status": "passed"},
             "R6": {"passed": 5, "failed": failed, "skipped": 0, "status": "failed" if failed else "passed"}}
    host = {"status": "failed" if failed else "passed", "totals": {"passed": 141 - failed, "failed": failed,
                                                                    "skipped": 13},
            "rules": rules, "kernel": {"lab1": release, "lab2": release}, "kernel_findings": findings,
            "workarounds": ["siw-zero-length-sge"] if name.startswith("siw") else []}
    model = {"status": "passed", "sequences": 2000, "divergences": 0,
             "sets": {"lab1+lab2": {"alternatives": alternatives or {}}}}
    bandwidth = {"lab1+lab2": {"harness": [{"bytes": 65536, "gbps": harness}],
                               "ib_write_bw": [{"bytes": 65536, "gbps": perftest}]}}
    (folder / "report.json").write_text(json.dumps({"status": host["status"], "hosts": {"lab1+lab2": host},
                                                    "model": model, "bandwidth": bandwidth}))


def test_the_matrix_reads_every_lab_in_kernel_order(tmp_path: Path) -> None:
    _lab(tmp_path, "siw-6.12", "6.12.117+deb13-amd64", alternatives={"error-ends-connection": 40})
    _lab(tmp_path, "rxe-6.12", "6.12.117+deb13-amd64", failed=1, findings=2)
    _lab(tmp_path, "rxe-6.1", "6.1.0-57-amd64", alternatives={"rc-queue-order": 3, "send-wait-bounded": 1})
    (tmp_path / "mutants-emulator").mkdir()  # not a lab
    rows = cells(tmp_path)
    assert [r["lab"] for r in rows] == ["rxe-6.1", "rxe-6.12", "siw-6.12"]
    rxe612 = rows[1]
    assert rxe612["releases"] == ["6.12.117+deb13-amd64"] and rxe612["failed_rules"] == ["R6"]
    assert rxe612["tests"] == {"passed": 140, "failed": 1, "skipped": 13} and rxe612["kernel_findings"] == 2
    assert rows[0]["model"]["alternatives"] == {"rc-queue-order": 3, "send-wait-bounded": 1}
    assert rows[2]["bandwidth_64k"] == {"harness_gbps": 0.11, "ib_write_bw_gbps": 0.07, "ratio": 1.57}
    table = render(rows).splitlines()
    assert table[2].startswith("| kernel | provider | release | suite |")
    assert table[5] == ("| 6.12 | rxe | 6.12.117+deb13-amd64 | failed: 140 passed, 1 failed, 13 skipped | R6 | "
                        "2 finding(s) | 2000 sequences, 0 divergence(s) | none | none | 13.8 / 8.8 (1.57) |")
    assert "`error-ends-connection` 40 | siw-zero-length-sge |" in table[6]


def test_the_matrix_command_writes_its_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _lab(tmp_path, "rxe-6.12", "6.12.117+deb13-amd64")
    assert main(["matrix", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (tmp_path / "matrix.md").read_text()
    assert json.loads((tmp_path / "matrix.json").read_text())[0]["lab"] == "rxe-6.12"
    assert main(["matrix", str(tmp_path / "rxe-6.12")]) == 2
    assert "no <provider>-<kernel>/report.json in" in capsys.readouterr().err


def test_a_reproducer_runs_this_module_in_the_guest() -> None:
    command = remote_command("siw-zero-length-sge")
    assert command[:2] == ["cd", str(Path(__file__).resolve().parents[3])]
    assert command[2:] == ["&&", "python3", "-m", "hil.lab.reproduce", "siw-zero-length-sge"]


def test_a_reproducer_without_a_device_cannot_tell(tmp_path: Path) -> None:
    if Path("/sys/class/infiniband").is_dir():
        pytest.skip("this machine has RDMA devices: the lab's reproducers run here for real")
    result = subprocess.run([sys.executable, "-m", "hil.lab.reproduce", "siw-zero-length-sge"],
                            capture_output=True, text=True, timeout=120, check=False)
    said: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == 2 and said["verdict"] == "inconclusive" and "no RDMA device" in said["detail"]


def test_an_oops_in_the_function_decides_the_verdict() -> None:
    from hil.lab.reproduce import _oops

    before = "[ 1.0] booted\n[ 2.0] siw0 up"
    oops = ("[ 1011.168938] BUG: kernel NULL pointer dereference, address: 0000000000000030\n"
            "[ 1011.176624] RIP: 0010:siw_tx_hdt+0x114/0xb50 [siw]")
    assert _oops(before, f"{before}\n{oops}", "siw_tx_hdt") == (
        "[ 1011.168938] BUG: kernel NULL pointer dereference, address: 0000000000000030")
    assert _oops(f"{before}\n{oops}", f"{before}\n{oops}\n[ 1200.0] later", "siw_tx_hdt") is None  # an old one
    assert _oops(before, f"{before}\n[ 3.0] BUG: something else", "siw_tx_hdt") is None
