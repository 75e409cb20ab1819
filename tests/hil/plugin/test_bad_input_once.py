"""Every bad input of issue 28, run as a user runs it: one short message naming the problem, no traceback.

Before, a backend that could not be built (a closed port, a bad ``san_remote_tmp``) cost one traceback per
test (214 errors, up to 17,000 lines), option errors came from inside a fixture, and ``san-hil`` printed
Python tracebacks. Each case here is a fresh pytest or ``san-hil`` process over the whole conformance suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hil.inventory import write_inventory
from tests.support.sshd import SshServer, free_port

MAX_LINES = 30
SUITE = ["--pyargs", "pytest_san.scenarios", "--san-backend=hil"]


def _inventory(path: Path, **hosts: dict[str, object]) -> Path:
    path.write_text(json.dumps({"all": {"children": {"san": {"hosts": hosts}}}}))
    return path


def _local(**more: object) -> dict[str, object]:
    return {"ansible_connection": "local", "san_engine": "emulator", "san_loopback": True, **more}


def _short(text: str, *names: str) -> None:
    lines = text.strip().splitlines()
    assert len(lines) < MAX_LINES, text
    assert "Traceback" not in text and "fixtures.py" not in text, text
    for name in names:
        assert name in text, f"{name!r} not in:\n{text}"


def _pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*SUITE, *args, timeout=600)


def test_a_closed_port(pytester: pytest.Pytester) -> None:
    port = free_port()  # nothing listens there
    result = _pytest(pytester, f"--san-hosts=ssh://127.0.0.1:{port}?engine=emulator&loopback=1")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=1)  # the first test; the session stops there
    _short(result.stdout.str(), f"127.0.0.1:{port}", "refused", "the hil backend could not be built")


@pytest.mark.parametrize("remote_tmp", ["/nonexistent-san-tmp/x", "relative/tmp", "a-file"])
def test_a_bad_san_remote_tmp(pytester: pytest.Pytester, remote_tmp: str) -> None:
    if remote_tmp == "a-file":
        remote_tmp = str(pytester.path / "a-file")
        Path(remote_tmp).write_text("not a directory")
    inventory = _inventory(pytester.path / "lab.json", h=_local(san_remote_tmp=remote_tmp))
    result = _pytest(pytester, f"--san-inventory={inventory}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=1)
    _short(result.stdout.str(), remote_tmp, "san_remote_tmp", "the hil backend could not be built")


@pytest.mark.parametrize(("option", "named"), [
    ("--san-lease-timeout=-5", "argument --san-lease-timeout: expected seconds >= 0, got '-5'"),
    ("--san-lease-timeout=nan", "argument --san-lease-timeout: expected seconds >= 0, got 'nan'"),
    ("--san-hosts-per-worker=0", "argument --san-hosts-per-worker: expected a number >= 1, 'auto' or 'all'"),
    ("--san-hosts-per-worker=5", "--san-hosts-per-worker=5, but the selection has 2 host(s): a, b"),
])
def test_a_bad_lease_option_is_a_usage_error(pytester: pytest.Pytester, option: str, named: str) -> None:
    inventory = _inventory(pytester.path / "lab.json", a=_local(), b=_local())
    result = _pytest(pytester, f"--san-inventory={inventory}", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # at configure time or session start: no test ran
    _short(result.stdout.str() + result.stderr.str(), named)


def test_a_lone_verbs_host_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """auto wants a pair of verbs hosts: said at session start, naming the way out."""
    inventory = _inventory(pytester.path / "lab.json", v=_local(san_engine="verbs", san_loopback=False))
    result = _pytest(pytester, f"--san-inventory={inventory}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _short(result.stderr.str(), "--san-hosts-per-worker auto is 2 (a pair of verbs hosts), but the selection has "
                                "1 host(s): v: add a host, or make each host san_loopback or emulator-engine")


def _san_hil(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("san-hil")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "hil.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, check=False)


def test_san_hil_nightly_out_a_file(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "lab.json", h=_local())
    afile = tmp_path / "afile"
    afile.write_text("x")
    done = _san_hil("nightly", "--inventory", str(inventory), "--out", str(afile), "--no-model")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"san-hil nightly: --out {afile}: {afile} exists and is not a directory\n"


def test_san_hil_matrix_of_no_directory(tmp_path: Path) -> None:
    done = _san_hil("matrix", str(tmp_path / "nonexistent"))
    assert done.returncode == 2
    assert done.stderr == (f"san-hil matrix: {tmp_path / 'nonexistent'}: no such directory (the folder san-hil "
                           "nightly's labs wrote)\n")


def test_san_hil_a_revoked_host_key(sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * {sshd.host_public_key}\n" + sshd.known_hosts.read_text())
    inventory = write_inventory(tmp_path / "lab.json", [sshd.host_config(name="revoked", known_hosts=known)])
    done = _san_hil("prepare", "--inventory", str(inventory))
    assert done.returncode == 1
    _short(done.stdout + done.stderr, "revoked", "host key not in", str(known))
    assert "Incorrect padding" not in done.stdout + done.stderr


def test_one_line() -> None:
    """san-hil's guard for what no command foresaw: an OSError's words and path, or a message's first line."""
    from hil.cli.main import one_line

    assert one_line(PermissionError(13, "Permission denied", "/x/matrix.json")) == "Permission denied: /x/matrix.json"
    assert one_line(RuntimeError("host lab1: gone\nmore")) == "host lab1: gone"


KILL_AND_HIDE = '''
import os, signal, time
from pathlib import Path

REMOTE_TMP = Path(os.environ["SAN_TEST_REMOTE_TMP"])


def test_kill(san_backend, san_switch):
    pid = san_backend.agents[0].client.channel.pid
    os.kill(pid, signal.SIGKILL)
    REMOTE_TMP.rename(REMOTE_TMP.with_name("moved"))  # its next start has nowhere to go


def test_second(san_switch):
    san_switch.connect()


def test_third(san_switch):
    san_switch.connect()
'''


def test_an_agent_that_cannot_start_again_is_reported_once(pytester: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    remote_tmp = pytester.path / "remote"
    remote_tmp.mkdir()
    monkeypatch.setenv("SAN_TEST_REMOTE_TMP", str(remote_tmp))
    inventory = _inventory(pytester.path / "lab.json", h=_local(san_remote_tmp=str(remote_tmp)))
    pytester.makepyfile(test_gone=KILL_AND_HIDE)
    result = pytester.runpytest_subprocess("--san-backend=hil",
                                           f"--san-inventory={inventory}", timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    text = result.stdout.str()
    assert "test_third" not in text, text  # the session stopped after the test whose cleanup found it gone
    _short(text, "its agent died", "could not be started again", str(remote_tmp),
           "no SAN test can run")
