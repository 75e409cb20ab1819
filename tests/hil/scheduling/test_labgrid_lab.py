"""--san-labgrid with real parts: labgrid-coordinator and labgrid-exporter on localhost, over the loopback sshd
lab hosts (four emulator hosts behind one sshd, so two pair places). Every wait is for a sign (a mark file, a
line, a lease gone), bounded generously; the runs' lease timeouts outlast the tests' own bounds.

- three xdist workers, two places: two run, the third waits, then runs; no host held by two at once;
- a worker killed with SIGKILL: its place stays acquired until the reaper releases it, then the waiter runs;
- a coordinator restarted mid-run: another identity is given the held place, and the kernel lease refuses it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.agent import lease
from hil.inventory import HostConfig
from tests.hil.controller.test_leases import _no_overlap
from tests.support.lab_hosts import host_configs, pytest_env, start_pytest, write_inventory
from tests.support.labgrid_lab import LabgridLab
from tests.support.sshd import SshServer, is_running, wait_until

pytest.importorskip("labgrid", reason="the labgrid extra is not installed")

SIGN = 300.0  # seconds a sign may take: pytest, workers and agents start over SSH on a loaded machine
LEASE_TIMEOUT = f"--san-lease-timeout={int(4 * SIGN)}"  # never what decides: the tests release on signs
NAMES = ("leaseA", "leaseB", "leaseC", "leaseD")

HOLD = '''
import os, time
from pathlib import Path

MARKS = Path(os.environ["SAN_TEST_MARKS"])


def test_hold(san_switch, san_backend):
    conn = san_switch.connect()
    me = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (MARKS / f"{me}.tmp").write_text(f"{os.getpid()} " + ",".join(a.host.name for a in san_backend.agents))
    (MARKS / f"{me}.tmp").rename(MARKS / me)
    deadline = time.monotonic() + 900
    while not (MARKS / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    conn.local.send(b"x")
    assert conn.remote.recv(1) == b"x"
'''

QUICK = '''
import pytest


@pytest.mark.parametrize("n", range(6))
def test_quick(san_switch, n):
    conn = san_switch.connect()
    conn.local.send(b"x")
    assert conn.remote.recv(1) == b"x"
'''


@pytest.fixture
def four(sshd: SshServer, remote_tmp: Path) -> list[HostConfig]:
    return host_configs(sshd, remote_tmp, NAMES)


@pytest.fixture
def lab(tmp_path: Path, four: list[HostConfig]) -> Iterator[LabgridLab]:
    directory = tmp_path / "labgrid"
    directory.mkdir()
    lab = LabgridLab(directory, four)
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()


def _args(lab: LabgridLab, inventory: Path, *more: str) -> list[str]:
    return ["--san-labgrid", "san=pair", "--san-labgrid-coordinator", lab.address, f"--san-inventory={inventory}",
            LEASE_TIMEOUT, *more]


def _held_leases(remote_tmp: Path) -> dict[str, dict[str, Any] | None]:
    return {name: lease.read_holder(lease.lease_name(str(remote_tmp), name)) for name in NAMES}


def test_three_workers_two_places_two_run_the_third_waits_then_runs(
        lab: LabgridLab, four: list[HostConfig], tmp_path: Path, remote_tmp: Path) -> None:
    lab.add_places({"pair1": (NAMES[:2], {"san": "pair"}), "pair2": (NAMES[2:], {"san": "pair"})})
    inventory = write_inventory(tmp_path / "lab.json", four)
    (tmp_path / "test_quick.py").write_text(QUICK)
    with (tmp_path / "run.log").open("wb") as log:
        run = start_pytest(["-n", "3", *_args(lab, inventory, "--san-report=r.json"), "test_quick.py"], tmp_path, log)
        try:
            assert run.wait(SIGN) == 0, (tmp_path / "run.log").read_text()[-5000:]
        finally:
            run.kill()
    output = (tmp_path / "run.log").read_text()
    waited = [line for line in output.splitlines() if "san: waiting for a labgrid place with san=pair" in line]
    assert waited, output[-5000:]
    assert all(" acquired by worker gw" in line for line in waited), waited  # who holds what
    report = json.loads((tmp_path / "r.json").read_text())
    leases = report["leases"]
    assert sorted(r["worker"] for r in leases) == ["gw0", "gw1", "gw2"]
    assert all(sorted(r["hosts"]) in (list(NAMES[:2]), list(NAMES[2:])) for r in leases)  # a pair place each
    _no_overlap(leases)  # the agents' lease records: no host held by two workers at once
    assert lab.acquired() == {"pair1": None, "pair2": None}  # every place cancelled and released
    assert _held_leases(remote_tmp) == dict.fromkeys(NAMES)


def test_a_killed_worker_keeps_its_place_until_the_reaper_frees_it(
        lab: LabgridLab, four: list[HostConfig], tmp_path: Path, remote_tmp: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    lab.add_places({"pair1": (NAMES[:2], {"san": "pair"})})
    inventory = write_inventory(tmp_path / "lab.json", four)
    (tmp_path / "test_hold.py").write_text(HOLD.replace("def test_hold", "@__import__('pytest').mark.parametrize("
                                                        "'n', range(2))\ndef test_hold").replace(
        "(san_switch, san_backend)", "(san_switch, san_backend, n)"))
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SAN_TEST_MARKS", str(marks))
    reap = [sys.executable, "-m", "hil.cli", "labgrid", "reap", "--coordinator", lab.address,
            "--inventory", str(inventory), "--min-age", "0"]
    with (tmp_path / "run.log").open("wb") as log:
        run = start_pytest(["-n", "2", *_args(lab, inventory), "test_hold.py"], tmp_path, log)
        try:
            assert wait_until(lambda: any(p.name.startswith("gw") and "." not in p.name for p in marks.iterdir())
                              and b"san: waiting for a labgrid place" in (tmp_path / "run.log").read_bytes(),
                              timeout=SIGN), (tmp_path / "run.log").read_text()
            (holder,) = [p for p in marks.iterdir() if p.name.startswith("gw") and "." not in p.name]
            pid = int(holder.read_text().split()[0])
            kept = subprocess.run(reap, capture_output=True, text=True, timeout=SIGN, env=pytest_env())
            assert kept.returncode == 0 and "kept pair1: acquired by " in kept.stdout, kept.stdout + kept.stderr
            assert "host leaseA holds lease pytest-san-lease/" in kept.stdout  # never a place with a live lease
            os.kill(pid, signal.SIGKILL)  # the worker holding pair1
            assert wait_until(lambda: not is_running(pid) and not any(_held_leases(remote_tmp).values()),
                              timeout=SIGN)  # its agents went with its SSH connections, their leases with them
            assert lab.acquired()["pair1"] is not None  # labgrid did not notice
            reaped = subprocess.run(reap, capture_output=True, text=True, timeout=SIGN, env=pytest_env())
            assert reaped.returncode == 0 and "released pair1" in reaped.stdout, reaped.stdout + reaped.stderr
            assert wait_until(lambda: len([p for p in marks.iterdir() if p.name.startswith("gw")
                                           and "." not in p.name]) == 2, timeout=SIGN), \
                (tmp_path / "run.log").read_text()  # the waiter got the place and runs
            (marks / "release").write_text("")
            assert run.wait(SIGN) == 1, (tmp_path / "run.log").read_text()  # the killed worker's test failed
        finally:
            (marks / "release").write_text("")
            run.kill()
    output = (tmp_path / "run.log").read_text()
    assert "1 failed, 1 passed" in output, output[-3000:]
    assert lab.acquired() == {"pair1": None}  # free, and nothing left on the hosts
    assert _held_leases(remote_tmp) == dict.fromkeys(NAMES)


def test_a_restarted_coordinator_double_books_and_the_kernel_lease_refuses_naming_the_holder(
        lab: LabgridLab, four: list[HostConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab.add_places({"pair1": (NAMES[:2], {"san": "pair"})})
    inventory = write_inventory(tmp_path / "lab.json", four)
    (tmp_path / "test_hold.py").write_text(HOLD)
    (tmp_path / "test_other.py").write_text("def test_other(san_switch):\n    san_switch.connect()\n")
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SAN_TEST_MARKS", str(marks))
    with (tmp_path / "first.log").open("wb") as log:
        first = start_pytest([*_args(lab, inventory, "--san-report=first.json"), "test_hold.py"], tmp_path, log)
        try:
            assert wait_until(lambda: (marks / "main").exists(), timeout=SIGN), (tmp_path / "first.log").read_text()
            held = lab.acquired()["pair1"]
            assert held is not None and ".main" in held
            lab.restart()  # the coordinator forgets every lock (places.yaml keeps the places)
            assert lab.acquired() == {"pair1": None}
            second = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_args(lab, inventory), "test_other.py"],
                cwd=tmp_path, capture_output=True, text=True, timeout=SIGN, env=pytest_env())
            assert second.returncode != 0, second.stdout
            (line,) = [x for x in second.stdout.splitlines() if x.startswith("san: the hil backend could not be")]
            assert line.startswith("san: the hil backend could not be built: labgrid double-booked place pair1 "
                                   f"(coordinator {lab.address}): it gave the place to worker main of run "), line
            # the real holder, from the kernel: the first run's agent, its pid and user
            assert f", but host {NAMES[0]} is leased by worker main of run " in line and " its agent pid " in line
            assert " of user " in line and "nothing ran on it" in line
            assert lab.acquired() == {"pair1": None}  # the second run gave it back
            (marks / "release").write_text("")
            assert first.wait(SIGN) == 0, (tmp_path / "first.log").read_text()  # its test ran on its own hosts
        finally:
            (marks / "release").write_text("")
            first.kill()


def test_sigterm_stops_the_agents_cancels_then_releases(
        lab: LabgridLab, four: list[HostConfig], tmp_path: Path, remote_tmp: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    lab.add_places({"pair1": (NAMES[:2], {"san": "pair"})})
    inventory = write_inventory(tmp_path / "lab.json", four)
    (tmp_path / "test_hold.py").write_text(HOLD)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SAN_TEST_MARKS", str(marks))
    with (tmp_path / "run.log").open("wb") as log:
        run = start_pytest([*_args(lab, inventory), "test_hold.py"], tmp_path, log)
        try:
            assert wait_until(lambda: (marks / "main").exists(), timeout=SIGN), (tmp_path / "run.log").read_text()
            assert lab.acquired()["pair1"] is not None and any(_held_leases(remote_tmp).values())
            run.send_signal(signal.SIGTERM)
            assert run.wait(SIGN) == -signal.SIGTERM  # it still dies of the signal, once it has let go
        finally:
            (marks / "release").write_text("")
            run.kill()
    assert lab.acquired() == {"pair1": None}
    session = lab.session()
    try:
        assert session.reservations() == []  # cancelled, not left to expire
    finally:
        session.close()
    assert _held_leases(remote_tmp) == dict.fromkeys(NAMES)
