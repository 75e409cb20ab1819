"""``san-hil run --on HOST``: a pytest command run on a lab host behind the test sshd (two emulator hosts on one
OpenSSH server on 127.0.0.1), its reports brought back; and what it refuses, on one line."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hil.agent.lease import lease_name
from hil.inventory import HostConfig, load_inventory
from hil.remote_run.arguments import INVENTORY_NAME, RunError, read_arguments, with_inventory
from hil.remote_run.lab_view import lab_view
from hil.remote_run.reports import bring_back
from hil.remote_run.runner import _partial_marker
from hil.remote_run.wheelhouse import HostPython, own_wheel
from tests.support import readme
from tests.support.lab_hosts import NAMES, host_configs, pytest_env, write_inventory
from tests.support.sshd import SshServer

TESTS = Path(__file__).resolve().parents[2]
HANGS = '''
import sys, time

def test_hangs(san_switch):
    san_switch.connect()
    print("STARTED", flush=True)
    time.sleep(300)
'''


@pytest.fixture(scope="module")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's wheelhouse cache: built once, by the first run."""
    return tmp_path_factory.mktemp("wheel-cache")


@pytest.fixture
def lab(sshd: SshServer, remote_tmp: Path, tmp_path: Path) -> Path:
    """A directory holding lab.json: two emulator hosts (leaseA, leaseB) behind the test sshd."""
    write_inventory(tmp_path / "lab.json", host_configs(sshd, remote_tmp))
    return tmp_path


def san_hil(cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = pytest_env()
    env["PYTHONPATH"] = str(TESTS.parent)  # the san-hil of this checkout, in every directory
    return subprocess.Popen([sys.executable, "-m", "hil.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finished(process: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def remote_processes(remote_tmp: Path) -> list[str]:
    """Command lines of this user's processes that run from the lab's remote tmp (the watchdog, the venv's pytest,
    the agents)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(remote_tmp) in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def leases_held(remote_tmp: Path) -> list[str]:
    names = {"@" + lease_name(str(remote_tmp), name) for name in NAMES}
    return [line for line in Path("/proc/net/unix").read_text().splitlines() if names.intersection(line.split())]


# -- with the test sshd (slow) ------------------------------------------------------------------------------


def test_the_readme_example_runs_on_a_lab_host_and_its_reports_come_back(lab: Path, wheel_cache: Path) -> None:
    (lab / "tests").mkdir()
    (lab / "tests" / "test_readme.py").write_text(readme.example())
    (lab / "tests" / "test_downstream.py").write_text((TESTS / "support" / "downstream_example.py").read_text())
    status, out, err = finished(san_hil(lab, "run", "--on", "leaseA", "--inventory", "lab.json", "--wheel-cache",
                                        str(wheel_cache), "--", "tests", "--junitxml=out/junit.xml",
                                        "--san-report", "out/report.json"))
    assert status == 0, out + err
    assert "2 passed" in out, out + err
    assert "reports:" in err, err
    suite = ET.parse(lab / "out" / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
    report = json.loads((lab / "out" / "report.json").read_text())
    assert report["backend"] == "hil" and len(report["tests"]) == 2
    assert ("made" in err or "reused" in err) and "reports:" in err  # made by this test or an earlier one
    # The second run reuses the wheelhouse and the venv: nothing is built.
    status, out, err = finished(san_hil(lab, "run", "--on", "leaseA", "--inventory", "lab.json", "--wheel-cache",
                                        str(wheel_cache), "--", "tests/test_readme.py", "-q"))
    assert status == 0 and "1 passed" in out, out + err
    assert "cached in" in err and "reused" in err and "made" not in err, err


def test_the_exit_status_is_pytests(lab: Path, wheel_cache: Path) -> None:
    (lab / "test_fails.py").write_text("def test_fails():\n    assert False\n")
    status, out, err = finished(san_hil(lab, "run", "--on", "leaseB", "--inventory", "lab.json", "--wheel-cache",
                                        str(wheel_cache), "--", "test_fails.py", "-q"))
    assert status == 1 and "1 failed" in out, out + err


@pytest.mark.parametrize(("stop", "status"), [(signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)],
                         ids=["ctrl-c", "killed"])
def test_ctrl_c_or_a_killed_san_hil_leaves_no_process_and_no_lease_on_the_host(
        lab: Path, wheel_cache: Path, remote_tmp: Path, stop: signal.Signals, status: int) -> None:
    """Ctrl-C stops the run through the watchdog; a killed san-hil closes its SSH connection, and the watchdog
    sees its stdin end."""
    (lab / "test_hangs.py").write_text(HANGS)
    process = san_hil(lab, "run", "--on", "leaseA", "--inventory", "lab.json", "--wheel-cache", str(wheel_cache),
                      "--", "test_hangs.py", "-s", "-q")
    seen: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            if "STARTED" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(600), "".join(seen)
        assert leases_held(remote_tmp), "the run holds its hosts' leases while it runs"
        process.send_signal(stop)
        ended = process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.stderr is not None
    assert ended == status, process.stderr.read()
    reader.join(30)
    if stop == signal.SIGINT:  # pytest's own interrupt, its summary shown
        assert "KeyboardInterrupt" in "".join(seen), "".join(seen)
    deadline = time.monotonic() + 30
    while (remote_processes(remote_tmp) or leases_held(remote_tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert remote_processes(remote_tmp) == []
    assert leases_held(remote_tmp) == []
    assert not list(remote_tmp.glob("pytest-san-work-*")), "the run's working directory was removed"


def test_a_host_without_python_is_one_line(sshd: SshServer, remote_tmp: Path, tmp_path: Path) -> None:
    host = sshd.host_config(name="nopython", engine="emulator", python_interpreter="/nonexistent/python3",
                            extra={"san_remote_tmp": str(remote_tmp)})
    write_inventory(tmp_path / "lab.json", [host])
    status, _, err = finished(san_hil(tmp_path, "run", "--on", "nopython", "--inventory", "lab.json", "--",
                                        "-q"))
    assert status == 1
    assert err.count("\n") == 1 and "no usable Python at /nonexistent/python3" in err, err


# -- without a host -----------------------------------------------------------------------------------------


def test_an_unknown_host_or_no_command_is_one_line(tmp_path: Path) -> None:
    write_inventory(tmp_path / "lab.json", [HostConfig(name="lab1", host="127.0.0.1", engine="emulator")])
    status, _, err = finished(san_hil(tmp_path, "run", "--on", "lab9", "--inventory", "lab.json", "--", "-q"))
    assert status == 2 and err.count("\n") == 1 and "no host named 'lab9' (its hosts: lab1)" in err, err
    status, _, err = finished(san_hil(tmp_path, "run", "--on", "lab1", "--inventory", "lab.json"))
    assert status == 2 and "give the command to run after --" in err.splitlines()[-1], err
    status, _, err = finished(san_hil(tmp_path, "run", "--on", "lab1", "--", "-q"))
    assert status == 2 and "which inventory?" in err.splitlines()[-1], err


def test_arguments_name_the_files_to_push_and_the_reports_to_bring_back(tmp_path: Path) -> None:
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "conftest.py").write_text("")
    (tmp_path / "tests" / "sub" / "test_a.py").write_text("def test_a(): pass\n")
    (tmp_path / "tests" / "sub" / "__pycache__").mkdir()
    (tmp_path / "tests" / "sub" / "__pycache__" / "x.pyc").write_bytes(b"")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    read = read_arguments([f"{tmp_path}/tests/sub/test_a.py::test_a", "-k", "a", "--junitxml", "j.xml",
                           "--san-report=r/report.json", "--san-inventory", "lab.yaml", "--html=h.html", "-n2"],
                          tmp_path)
    assert read.argv == ("tests/sub/test_a.py::test_a", "-k", "a", "--junitxml=.san-reports/0/j.xml",
                         "--san-report=.san-reports/1/report.json", "--html=.san-reports/2/h.html", "-n2")
    assert sorted(read.files) == ["pytest.ini", "tests/conftest.py", "tests/sub/test_a.py"]
    assert [r.local for r in read.reports] == [tmp_path / "j.xml", tmp_path / "r/report.json", tmp_path / "h.html"]
    assert read.inventory == tmp_path / "lab.yaml"
    assert read.requirements == ("pytest-html>=4", "pytest-xdist>=3")
    assert with_inventory(read.argv, mutants=False)[:2] == ("--san-backend=hil", f"--san-inventory={INVENTORY_NAME}")
    mutants = read_arguments(["--only", "x", "--inventory", "lab.yaml"], tmp_path, mutants=True)
    assert mutants.argv == ("--only", "x", "--out=.san-reports/0/mutants")
    assert mutants.reports[0].local == tmp_path / "mutants"
    # What follows mutants' own ``--`` is pytest's: its default --out goes before it, and an --out there is not
    # taken for mutants' (found on an rxe lab: the appended --out made every pytest run exit 4).
    passed = read_arguments(["--only", "x", "--", "--san-model-sequences", "0", "--out", "o"], tmp_path, mutants=True)
    assert passed.argv == ("--only", "x", "--out=.san-reports/0/mutants", "--", "--san-model-sequences", "0",
                           "--out", "o")
    with pytest.raises(RunError, match="outside the current directory"):
        read_arguments([str(TESTS / "conftest.py")], tmp_path)


def test_the_reports_land_where_they_were_asked_for_and_nowhere_else(tmp_path: Path) -> None:
    import tarfile

    [report] = read_arguments(["--html", "out/r.html"], tmp_path).reports

    def tar(*members: tuple[str, bytes]) -> bytes:
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as archive:
            for name, content in members:
                info = tarfile.TarInfo(name)
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
        return data.getvalue()

    written = bring_back(tar((".san-reports/0/r.html", b"<html>"), (".san-reports/0/assets/style.css", b"x")),
                         [report])
    assert written == [tmp_path / "out" / "r.html"]
    assert (tmp_path / "out" / "assets" / "style.css").read_bytes() == b"x"
    with pytest.raises(RunError, match="no report asked for"):
        bring_back(tar((".san-reports/0/../../evil", b"x"),), [report])


def test_the_inventory_as_the_run_host_sees_the_lab(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("")
    hosts = [HostConfig(name=n, host="127.0.0.1", port=port, user="root", key_file=key, engine="verbs",
                        extra={"san_lab_address": address})
             for n, port, address in (("lab1", 10022, "10.77.0.1/24"), ("lab2", 10023, "10.77.0.2/24"))]
    inventory = load_inventory(write_inventory(tmp_path / "lab.json", hosts))
    view = lab_view(inventory, "lab1", lambda path: False)
    (tmp_path / "seen.json").write_text(view.text)
    seen = load_inventory(tmp_path / "seen.json", check_files=False).hosts
    assert seen["lab1"].connection == "local"
    assert (seen["lab2"].host, seen["lab2"].port, seen["lab2"].key_file) == ("10.77.0.2", 22, None)
    assert any("lab address 10.77.0.2:22" in note for note in view.notes)


def test_the_wheelhouse_is_for_the_hosts_python_and_the_same_code_makes_the_same_wheel() -> None:
    host = HostPython((3, 11), "cpython", "aarch64", "glibc", "2.31", "/usr/bin/python3", True)
    assert host.platforms()[:2] == ["manylinux_2_31_aarch64", "manylinux_2_30_aarch64"]
    assert "manylinux2014_aarch64" in host.platforms() and host.platforms()[-1] == "linux_aarch64"
    assert HostPython((3, 9), "cpython", "x86_64", "glibc", "2.31", "/usr/bin/python3", True).check() is not None
    assert own_wheel() == own_wheel()


def test_a_marker_split_across_chunks_is_held_back() -> None:
    assert _partial_marker(b"output\x1eab", b"\x1eabcd ") == 3
    assert _partial_marker(b"output\n", b"\x1eabcd ") == 0


def test_the_benchmark_puts_local_and_remote_side_by_side(lab: Path, wheel_cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/remote.py against the loopback host, one round of one test: the three runs and the one-off
    costs are reported (the measurement itself is a lab's: docs/remote-run.md)."""
    spec = importlib.util.spec_from_file_location("bench_remote", TESTS.parent / "benchmarks" / "remote.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    (lab / "test_readme.py").write_text(readme.example())
    monkeypatch.chdir(lab)
    monkeypatch.setenv("PYTHONPATH", str(TESTS.parent))
    status = bench.main(["--inventory", "lab.json", "--on", "leaseA", "--rounds", "1", "--wheel-cache",
                         str(wheel_cache), "--json", "bench.json", "--", "test_readme.py"])
    out = capsys.readouterr().out
    assert status == 0, out
    result = json.loads((lab / "bench.json").read_text())
    assert set(result["medians"]) == {"local 0 ms", "local 20 ms", "remote 20 ms"}, out
    assert all("1 passed" in summary for summary in result["summaries"].values()), out
    assert "wheelhouse" in result["one_off"]["timings"] and "venv" in result["one_off"]["timings"], out
    assert "remote at 20 ms / local at 0 ms" in out


def test_without_an_index_the_installed_distributions_make_the_wheelhouse(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip download failing (no index reachable), a host of this machine's kind gets wheels zipped from what is
    installed here: pytest-san's dependencies and its hil extra's, and pip."""
    import zipfile

    from hil.remote_run import wheelhouse

    monkeypatch.setattr(wheelhouse, "_pip_download", lambda *args: "no index reachable")
    built = wheelhouse.build_wheelhouse(HostPython.here(), [], tmp_path)
    assert built.how.startswith("this controller's own site-packages (pip download failed: no index reachable")
    names = {name.split("-")[0].lower() for name in built.wheels}
    assert {"pytest_san", "pytest", "pluggy", "paramiko", "pyyaml", "pip"} <= names, names
    for name, data in built.wheels.items():
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            assert any(n.endswith(".dist-info/RECORD") for n in archive.namelist()), name
    assert wheelhouse.build_wheelhouse(HostPython.here(), [], tmp_path).how.startswith("cached in")


def test_the_watchdog_stops_the_command_when_the_heartbeats_stop(tmp_path: Path) -> None:
    """A connection dropped without a word: stdin stays open but silent; after 6 missed heartbeats the watchdog
    stops the command's whole process group and removes the working directory."""
    (tmp_path / "files").mkdir()
    pid_file = tmp_path / "child.pid"
    child = ("import os, subprocess, sys, time; "
             "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
             f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{grandchild.pid}}'); time.sleep(120)")
    spec = {"files": str(tmp_path / "files"), "tmp": str(tmp_path), "argv": [sys.executable, "-c", child],
            "collect": [], "nonce": "\x1etest", "heartbeat": 0.5, "env": {}}
    watchdog = TESTS.parent / "hil" / "remote_run" / "host" / "watchdog.py"
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, str(watchdog), json.dumps(spec)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
    try:
        assert process.wait(60) == 1
    finally:
        if process.poll() is None:
            process.kill()
        assert process.stdin is not None
        process.stdin.close()
    assert time.monotonic() - started < 30
    for pid in map(int, pid_file.read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert not list(tmp_path.glob("pytest-san-work-*"))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_venv_build_that_is_stopped_leaves_no_half_written_venv(tmp_path: Path, stop: signal.Signals) -> None:
    """Stopped (TERM: Ctrl-C over SSH), the build removes its partial directory; killed outright, it cannot, and
    the next build removes it. Neither leaves anything at the venv's name. (The wheelhouse's pip is a stand-in
    that hangs.)"""
    wheels = tmp_path / "wheels"
    (wheels / "pip-0-py3-none-any.whl" / "pip").mkdir(parents=True)
    (wheels / "pip-0-py3-none-any.whl" / "pip" / "__main__.py").write_text(
        f"import os, time\nopen({str(tmp_path / 'pips')!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "print('installing', flush=True)\ntime.sleep(120)\n")
    venv = tmp_path / "pytest-san-venv-u0-abc"
    make_venv = TESTS.parent / "hil" / "remote_run" / "host" / "make_venv.py"

    def build() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(make_venv), str(wheels), str(venv), "abc"], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    process = build()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "installing" in line:
                break
        assert list(tmp_path.glob("pytest-san-venv-u0-abc.partial-*"))
        process.send_signal(stop)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    left = list(tmp_path.glob("pytest-san-venv-u0-abc.partial-*"))
    assert not venv.exists()
    if stop == signal.SIGTERM:
        assert left == []
        return
    assert left, "a killed build leaves its partial directory"
    # Its pid is gone: the next build removes it before making its own.
    process = build()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "installing" in line:
                break
        assert [p.name for p in tmp_path.glob("pytest-san-venv-u0-abc.partial-*")] == [
            f"pytest-san-venv-u0-abc.partial-{process.pid}"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        for pid in map(int, (tmp_path / "pips").read_text().split()):  # the killed build's pip outlived it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_san_hil_mutants_runs_on_the_lab_host_and_its_out_directory_comes_back(lab: Path, wheel_cache: Path) -> None:
    """``--mutants``: `san-hil mutants --inventory <the rewritten one>` on the host, one entry on the scenarios
    of the rule it breaks; its --out directory comes back whole."""
    status, out, err = finished(san_hil(lab, "run", "--on", "leaseA", "--inventory", "lab.json", "--wheel-cache",
                                        str(wheel_cache), "--mutants", "--", "--only", "read_descriptor_writable",
                                        "--focus", "--jobs", "1", "--out", "found"))
    assert status == 0, out + err
    result = json.loads((lab / "found" / "mutants.json").read_text())
    assert result["mutants"]["read_descriptor_writable"]["verdict"] == "caught", result
    assert (lab / "found" / "read_descriptor_writable.log").is_file()


def test_send_keys_gives_the_run_its_peers_keys_and_takes_them_away(lab: Path, wheel_cache: Path,
                                                                      remote_tmp: Path) -> None:
    """--send-keys: the peer (leaseB) is reached with the key sent on the watchdog's stdin and the host key pinned
    at the peer's address as the host sees it; nothing of either stays on the host."""
    (lab / "test_readme.py").write_text(readme.example())
    status, out, err = finished(san_hil(lab, "run", "--on", "leaseA", "--inventory", "lab.json", "--wheel-cache",
                                        str(wheel_cache), "--send-keys", "--", "test_readme.py", "-q",
                                        "--san-report=report.json"))
    assert status == 0 and "1 passed" in out, out + err
    assert "key files and host keys go with the run" in err
    assert not list(remote_tmp.rglob(".san-keys")), "the keys went with the working directory"
    assert not list(remote_tmp.rglob("*.key"))


def test_sent_keys_are_pinned_at_the_address_the_host_sees(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("PRIVATE")
    known = tmp_path / "known_hosts"
    known.write_text("[127.0.0.1]:10023 ssh-ed25519 "
                     "AAAAC3NzaC1lZDI1NTE5AAAAIMZ9Ehm1pRg0yRKMtsDg0Bl2Udu7eYx3u7xdm4F3N6Yk\n")
    hosts = [HostConfig(name=n, host="127.0.0.1", port=port, user="root", key_file=key, known_hosts=known,
                        engine="verbs", extra={"san_lab_address": address})
             for n, port, address in (("lab1", 10022, "10.77.0.1/24"), ("lab2", 10023, "10.77.0.2/24"))]
    inventory = load_inventory(write_inventory(tmp_path / "lab.json", hosts))
    view = lab_view(inventory, "lab1", lambda path: True, send_keys=True)
    assert view.secrets[".san-keys/lab2.key"] == b"PRIVATE"
    assert view.secrets[".san-keys/known_hosts"].decode().startswith("10.77.0.2 ssh-ed25519 AAAAC3")
    assert "PRIVATE" not in view.text and '"ansible_ssh_private_key_file": ".san-keys/lab2.key"' in view.text
