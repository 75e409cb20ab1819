"""The hil plugin's host options: --san-hosts URLs, the fallbacks, overrides, errors once at session start.

The hosts here are this machine through a local connection with the emulator engine: no lab, no SSH.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

LOCAL = "local://?engine=emulator&loopback=1"
LOCAL_YAML = """\
all:
  children:
    san:
      hosts:
        localhost:
          ansible_connection: local
          san_engine: emulator
          san_loopback: true
"""
TEST_HOSTS = """
def test_hosts(san_backend):
    print("HOSTS", [(a.host.name, a.host.connection, a.host.engine) for a in san_backend.agents])
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-s", *args)


def test_host_url_without_an_inventory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_HOSTS)
    result = _run(pytester, "--san-backend=hil", f"--san-hosts={LOCAL}")
    result.assert_outcomes(passed=1)
    assert "HOSTS [('localhost', 'local', 'emulator')]" in result.stdout.str()


def test_a_plain_name_without_an_inventory_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_HOSTS, test_two=TEST_HOSTS)
    result = _run(pytester, "--san-backend=hil", "--san-hosts=lab1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--san-hosts 'lab1': a host name needs an inventory*ssh://*local://*"])
    assert "test_one" not in result.stdout.str()


def test_a_bad_host_url_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_HOSTS, test_two=TEST_HOSTS)
    result = _run(pytester, "--san-backend=hil", "--san-hosts=ssh://lab1?devcie=rxe0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().count("unknown option 'devcie'") == 1


def test_no_hosts_at_all_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_HOSTS, test_two=TEST_HOSTS)
    result = _run(pytester, "--san-backend=hil")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().count("--san-backend=hil needs lab hosts") == 1


def test_a_missing_inventory_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_HOSTS, test_two=TEST_HOSTS)
    result = _run(pytester, "--san-backend=hil", "--san-inventory=nowhere.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().count("inventory file not found") == 1


def test_names_still_select_from_the_inventory(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", lab=LOCAL_YAML)
    pytester.makepyfile(test_one=TEST_HOSTS)
    result = _run(pytester, "--san-backend=hil", "--san-inventory=lab.yaml", "--san-hosts=localhost")
    result.assert_outcomes(passed=1)
    bad = _run(pytester, "--san-backend=hil", "--san-inventory=lab.yaml", "--san-hosts=lab9")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*host 'lab9' is not in group 'san'*"])


def test_the_same_host_twice_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_HOSTS)
    result = _run(pytester, "--san-backend=hil", f"--san-hosts={LOCAL},{LOCAL}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*host 'localhost' given twice*"])


# -- item 2: SAN_BACKEND / SAN_INVENTORY, the ini key against the rootdir ----------------------------


def test_environment_chooses_backend_and_inventory(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = pytester.makefile(".yaml", lab=LOCAL_YAML)
    pytester.makepyfile(test_one=TEST_HOSTS)
    monkeypatch.setenv("SAN_BACKEND", "hil")
    monkeypatch.setenv("SAN_INVENTORY", str(inv))
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["san backend: hil"])
    # the option beats the environment
    result = _run(pytester, "--san-backend=emulator")
    result.stdout.fnmatch_lines(["san backend: emulator"])


def test_environment_beats_the_ini_key(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nsan_backend = hil\nsan_inventory = nowhere.yaml\n")
    inv = pytester.makefile(".yaml", lab=LOCAL_YAML)
    pytester.makepyfile(test_one=TEST_HOSTS)
    monkeypatch.setenv("SAN_BACKEND", "emulator")
    _run(pytester).stdout.fnmatch_lines(["san backend: emulator"])
    monkeypatch.setenv("SAN_BACKEND", "hil")
    monkeypatch.setenv("SAN_INVENTORY", str(inv))
    _run(pytester).assert_outcomes(passed=1)


def test_ini_inventory_is_relative_to_the_rootdir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAN_BACKEND", raising=False)
    monkeypatch.delenv("SAN_INVENTORY", raising=False)
    pytester.makeini("[pytest]\nsan_backend = hil\nsan_inventory = lab/lab.yaml\n")
    (pytester.path / "lab").mkdir()
    (pytester.path / "lab" / "lab.yaml").write_text(LOCAL_YAML)
    sub = pytester.path / "sub"
    sub.mkdir()
    (sub / "test_one.py").write_text(TEST_HOSTS)
    monkeypatch.chdir(sub)
    result = pytester.runpytest_subprocess("-s", "--rootdir", str(pytester.path),
                                           "-c", str(pytester.path / "tox.ini"), str(sub))
    result.assert_outcomes(passed=1)


# -- item 3: san_port, and --san-device/--san-port/--san-gid-index on every host ---------------------

TEST_DEVICE = """
def test_device(san_backend):
    print("DEVICE", [(a.host.name, a.host.device, a.host.device_port, a.host.gid_index) for a in san_backend.agents])
"""


def test_san_port_in_an_inventory_and_a_host_url() -> None:
    from types import SimpleNamespace

    from hil.controller.client import AgentClient
    from hil.inventory import InventoryError, parse_host_string

    host = parse_host_string("ssh://root@lab1:2222?device=rxe0&port=1&gid_index=1", check_files=False)
    assert (host.port, host.device, host.device_port, host.gid_index) == (2222, "rxe0", 1, 1)
    assert AgentClient._engine_options(SimpleNamespace(host=host)) == {  # type: ignore[arg-type]
        "device": "rxe0", "gid_index": 1, "netdev": None, "port": 1}
    assert "port" not in AgentClient._engine_options(SimpleNamespace(  # type: ignore[arg-type]
        host=parse_host_string("ssh://lab1", check_files=False)))
    with pytest.raises(InventoryError, match="san_port: expected an RDMA port number 1-255"):
        parse_host_string("ssh://lab1?port=0", check_files=False)


def test_san_port_key_is_read(tmp_path: Path) -> None:
    from hil.inventory import load_inventory

    path = tmp_path / "lab.yaml"
    path.write_text(LOCAL_YAML.replace("san_loopback: true", "san_loopback: true\n          san_port: 2"))
    assert load_inventory(path).hosts["localhost"].device_port == 2


def test_command_line_overrides_every_host(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_DEVICE)
    result = _run(pytester, "--san-backend=hil", f"--san-hosts={LOCAL}", "--san-device=rxe7", "--san-port=2",
                  "--san-gid-index=3")
    result.assert_outcomes(passed=1)
    assert "DEVICE [('localhost', 'rxe7', 2, 3)]" in result.stdout.str()


def test_a_bad_override_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=TEST_DEVICE)
    result = _run(pytester, "--san-backend=hil", f"--san-hosts={LOCAL}", "--san-port=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--san-port 0: expected an integer 1-255*"])


# -- item 5: without the hil extra, one line naming it -------------------------------------------------

BLOCKER = """
import sys
for name in {names!r}:
    sys.modules[name] = None  # `import name` now fails as if it were not installed
"""


@pytest.mark.parametrize("missing", ["paramiko", "yaml"])
def test_without_the_hil_extra_one_line_names_it(pytester: pytest.Pytester, missing: str) -> None:
    pytester.makepyfile(blocker=BLOCKER.format(names=[missing]), test_one=TEST_HOSTS)
    pytester.makefile(".yaml", lab=LOCAL_YAML.replace("ansible_connection: local", "ansible_host: 127.0.0.1"))
    result = _run(pytester, "-p", "blocker", "--san-backend=hil", "--san-inventory=lab.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.stderr.str().splitlines() if line.strip()]
    assert len(lines) == 1 and missing in lines[0] and "pip install 'pytest-san[hil]'" in lines[0], lines
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_san_hil_without_the_hil_extra_one_line_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from hil.cli.main import main

    monkeypatch.setitem(sys.modules, "yaml", None)
    (tmp_path / "lab.yaml").write_text(LOCAL_YAML)
    assert main(["prepare", "--inventory", str(tmp_path / "lab.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "pip install 'pytest-san[hil]'" in err


def test_a_backend_plugin_import_failure_names_the_extra() -> None:
    from pytest_san.plugin.backends import _extra_providing, backend_entry_points

    ep = backend_entry_points()["hil"]
    assert _extra_providing(ep, ModuleNotFoundError("No module named 'yaml'", name="yaml")) == "hil"
    assert _extra_providing(ep, ModuleNotFoundError("No module named 'paramiko.x'", name="paramiko.x")) == "hil"
    assert _extra_providing(ep, ModuleNotFoundError("No module named 'nope'", name="nope")) is None
