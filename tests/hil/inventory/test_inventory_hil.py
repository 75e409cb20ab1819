"""What reads inventories reads INI and group_vars/, host_vars/ as well: the hil backend (--san-inventory,
SAN_INVENTORY) and ``san-hil prepare``, on this machine through the local transport with the emulator engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import readme

# The engine and loopback come only from the vars directories: without them the host would be a verbs one.
HOSTS = "# this machine\n[san]\nlocalhost ansible_connection=local\n"
VARS = {"group_vars/san.yml": "san_engine: emulator\n", "host_vars/localhost/loopback.yml": "san_loopback: true\n"}

# The README's example, and where the backend's hosts came from (printed: ``-s``).
TRANSFER = readme.example() + """

def test_hosts(san_backend):
    print("HOSTS", [(a.host.name, a.host.connection, a.host.engine, a.host.loopback) for a in san_backend.agents])
"""
LOCAL_EMULATOR = "HOSTS [('localhost', 'local', 'emulator', True)]"


def _lab(directory: Path) -> Path:
    for name, text in VARS.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    (directory / "hosts").write_text(HOSTS)
    return directory / "hosts"


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-s", *args)


def test_the_hil_backend_runs_from_an_ini_inventory_with_vars_directories(pytester: pytest.Pytester) -> None:
    _lab(pytester.path)
    pytester.makepyfile(test_one=TRANSFER)
    result = _run(pytester, "--san-backend=hil", "--san-inventory=hosts")
    result.assert_outcomes(passed=2)
    assert LOCAL_EMULATOR in result.stdout.str()


def test_san_inventory_names_an_ini_inventory(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    pytester.makepyfile(test_one=TRANSFER)
    monkeypatch.setenv("SAN_BACKEND", "hil")
    monkeypatch.setenv("SAN_INVENTORY", str(_lab(tmp_path)))
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    assert LOCAL_EMULATOR in result.stdout.str()


def test_a_bad_ini_line_is_one_usage_error_naming_file_and_line(pytester: pytest.Pytester) -> None:
    _lab(pytester.path)
    (pytester.path / "hosts").write_text(HOSTS + "[san:var]\n")
    pytester.makepyfile(test_one=TRANSFER, test_two=TRANSFER)
    result = _run(pytester, "--san-backend=hil", "--san-inventory=hosts")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().count("hosts: line 4: '[san:var]': unknown section kind 'var'") == 1


def test_san_hil_prepare_reads_ini_and_vars_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hil.cli.main import main

    assert main(["prepare", "--inventory", str(_lab(tmp_path))]) == 0
    assert capsys.readouterr().out.startswith("localhost: ready")
    (tmp_path / "group_vars/san.yml").write_text("san_engine: verb\n")
    assert main(["prepare", "--inventory", str(tmp_path / "hosts")]) == 2
    assert capsys.readouterr().err == (f"san-hil: {tmp_path / 'group_vars/san.yml'}: group 'san': san_engine: "
                                       "expected one of 'verbs', 'emulator', got 'verb'\n")
