"""``san-hil`` itself: its version, its options, and what it refuses before doing anything."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import pytest_san
from hil.cli.main import build_parser


def _san_hil(*argv: str, env: dict[str, str] | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``san-hil`` as a user runs it: the installed console script where there is one, else the module."""
    script = Path(sys.executable).with_name("san-hil")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "hil.cli"]
    return subprocess.run([*command, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
                          check=False)


# --- --version ---------------------------------------------------------------------------------------


def test_version_is_the_packages() -> None:
    result = _san_hil("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"san-hil {pytest_san.__version__}\n"
    # one source: the installed distribution's metadata says the same
    assert pytest_san.__version__ == version("pytest-san")


# --- --inventory: YAML or INI ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["prepare", "nightly"])
def test_inventory_help_names_both_forms(command: str) -> None:
    result = _san_hil(command, "--help")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())  # argparse wraps the help texts
    assert "lab inventory: an Ansible inventory file, YAML or INI, with group_vars/ and host_vars/ beside it" in said
    assert "Ansible-style" not in said


# --- --hosts is a count (lab up/run); host names are --limit -------------------------------------------


def _two_local_hosts(tmp_path: Path) -> Path:
    path = tmp_path / "lab.json"
    host = {"ansible_connection": "local", "san_engine": "emulator", "san_remote_tmp": str(tmp_path)}
    path.write_text(json.dumps({"all": {"children": {"san": {"hosts": {"h1": host, "h2": host}}}}}))
    return path


def test_prepare_selects_hosts_with_limit(tmp_path: Path) -> None:
    inventory = _two_local_hosts(tmp_path)
    result = _san_hil("prepare", "--inventory", str(inventory), "--limit", "h2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("h2: ready") and "h1" not in result.stdout
    assert "--limit NAMES" in _san_hil("prepare", "--help").stdout


@pytest.mark.parametrize("command", [["prepare"], ["nightly", "--out", "nightly"]])
def test_hosts_with_names_is_refused_naming_limit(tmp_path: Path, command: list[str]) -> None:
    inventory = _two_local_hosts(tmp_path)
    result = _san_hil(*command, "--inventory", str(inventory), "--hosts", "h2", cwd=tmp_path)
    assert result.returncode == 2
    assert f"san-hil {command[0]}: error: --hosts is not an option of this command: use --limit h2" in result.stderr
    assert result.stdout == "" and not (tmp_path / "nightly").exists()  # nothing ran
    assert "--hosts" not in _san_hil(command[0], "--help").stdout


def test_nightly_limit_selects_from_the_inventory(tmp_path: Path) -> None:
    inventory = _two_local_hosts(tmp_path)
    result = _san_hil("nightly", "--inventory", str(inventory), "--out", str(tmp_path / "out"), "--limit", "h3")
    assert result.returncode == 2
    assert "host 'h3' is not in group 'san'; its hosts: h1, h2" in result.stderr


# --- options before `--` are san-hil's; an unknown one is refused before anything runs ------------------


def test_a_typo_in_lab_run_boots_nothing(tmp_path: Path) -> None:
    state, cache = tmp_path / "state", tmp_path / "kernels"
    result = _san_hil("lab", "run", "--hots", "3", "--state-dir", str(state), "--kernel-cache", str(cache))
    assert result.returncode == 2
    assert "san-hil lab run: error: unrecognized arguments: --hots 3 (did you mean --hosts?)" in result.stderr
    assert "pytest's arguments go after --" in result.stderr
    assert not state.exists() and not cache.exists()  # no kernel fetched, no guest started, nothing written


@pytest.mark.parametrize(("argv", "said"), [
    (["lab", "run", "-x", "-k", "rdma"], "lab run: error: unrecognized arguments: -x -k rdma; pytest's arguments go "
                                         "after --: san-hil lab run [options] -- [pytest args]"),
    (["lab", "up", "--memroy", "2G"], "lab up: error: unrecognized arguments: --memroy 2G (did you mean --memory?)"),
    (["lab", "down", "--state-dri", "x"], "lab down: error: unrecognized arguments: --state-dri x "
                                          "(did you mean --state-dir?)"),
    (["--verison"], "san-hil: error: unrecognized arguments: --verison (did you mean --version?)"),
    (["prepare", "--inventory", "x.yaml", "--limt", "a", "--jsn"],
     "prepare: error: unrecognized arguments: --limt a --jsn (--limt: did you mean --limit?; --jsn: did you mean "
     "--json?)"),
    (["prepare", "--inventory", "x.yaml", "--", "-v"], "prepare: error: takes no arguments after --: -v"),
    (["nightly", "--inventory", "x.yaml", "--out", "o", "--job", "2"],
     "nightly: error: unrecognized arguments: --job 2 (abbreviations are not accepted: did you mean --jobs?)"),
    (["nightly", "--inventory", "x.yaml", "--out", "o", "-x", "-k", "rdma"],
     "nightly: error: unrecognized arguments: -x -k rdma; pytest's arguments go after --: san-hil nightly [options] "
     "-- [pytest args]"),
])
def test_unknown_options_are_refused_with_a_suggestion(tmp_path: Path, argv: list[str], said: str) -> None:
    result = _san_hil(*argv, cwd=tmp_path)
    assert result.returncode == 2
    assert said in result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                found += _parsers(command)
    return found


def test_no_parser_expands_abbreviations() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) >= 8  # san-hil, prepare, lab and its five commands, nightly
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize(("argv", "said"), [
    # `--kernel-c` once meant --kernel-cache: a new kernel cache in ./x, and a boot
    (["lab", "up", "--kernel-c", "x"], "lab up: error: unrecognized arguments: --kernel-c x (abbreviations are not "
                                       "accepted: did you mean --kernel-cache?)"),
    (["lab", "run", "--prov", "siw"], "lab run: error: unrecognized arguments: --prov siw (abbreviations are not "
                                      "accepted: did you mean --provider?)"),
    (["lab", "down", "--state", "x"], "lab down: error: unrecognized arguments: --state x (abbreviations are not "
                                      "accepted: did you mean --state-dir?)"),
    (["--ver"], "san-hil: error: unrecognized arguments: --ver (abbreviations are not accepted: did you mean "
                "--version or --verbose?)"),
    (["prepare", "--inventory", "x.yaml", "--create"], "prepare: error: unrecognized arguments: --create "
                                                       "(abbreviations are not accepted: did you mean --create-rxe?)"),
    (["nightly", "--inventory", "x.yaml", "--out", "o", "--lim", "a"],
     "nightly: error: unrecognized arguments: --lim a (abbreviations are not accepted: did you mean --limit?)"),
    # a required option abbreviated is missing, by its full name
    (["nightly", "--inv", "x.yaml", "--out", "o"], "nightly: error: the following arguments are required: "
                                                   "--inventory"),
])
def test_an_abbreviation_is_refused_naming_the_full_option(tmp_path: Path, argv: list[str], said: str) -> None:
    result = _san_hil(*argv, cwd=tmp_path)
    assert result.returncode == 2
    assert said in result.stderr, result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []  # nothing booted, fetched or written


def test_nightly_usage_puts_pytest_args_after_a_required_dashdash() -> None:
    result = _san_hil("nightly", "--help")
    assert result.returncode == 0, result.stderr
    usage = result.stdout.split("\n\n")[0]
    assert usage == "usage: san-hil nightly --inventory PATH --out DIR [options] [-- pytest args ...]"
    assert "(pytest's arguments after --)" in " ".join(_san_hil("--help").stdout.split())


@pytest.mark.parametrize(("argv", "verbose", "guest_command"), [
    (["prepare", "--inventory", "x.yaml"], False, None),
    (["-v", "prepare", "--inventory", "x.yaml"], True, None),
    (["prepare", "--inventory", "x.yaml", "-v"], True, None),
    (["nightly", "--verbose", "--inventory", "x.yaml", "--out", "o"], True, None),
    (["lab", "up", "-v"], True, None),
    (["lab", "-v", "down"], True, None),
    (["-v", "lab", "status"], True, None),
    (["lab", "ssh", "lab1", "-v"], False, ["-v"]),  # after GUEST: the guest's command
    (["lab", "ssh", "-v", "lab1", "ls", "-v"], True, ["ls", "-v"]),
])
def test_verbose_before_or_after_the_command(argv: list[str], verbose: bool, guest_command: list[str] | None) -> None:
    args, unknown = build_parser().parse_known_args(argv)
    assert (args.verbose, unknown) == (verbose, [])
    assert getattr(args, "remote_command", None) == guest_command


# --- an ASCII locale ----------------------------------------------------------------------------------

HELP = [["--help"], ["prepare", "--help"], ["lab", "--help"], *(["lab", c, "--help"] for c in
                                                                 ("up", "down", "status", "ssh", "run")),
        ["nightly", "--help"]]


def test_every_command_survives_an_ascii_locale(tmp_path: Path) -> None:
    """What san-hil prints may hold other characters (a path, a host's message): escaped, never a crash."""
    env = {**os.environ, "LC_ALL": "C", "PYTHONIOENCODING": "ascii:strict"}  # stdout strict, as plain "ascii"
    state = tmp_path / "l\u00e4b"  # a state directory whose name is not ASCII
    inventory = tmp_path / "lab.json"
    host = {"ansible_connection": "local", "san_engine": "emulator", "san_remote_tmp": str(tmp_path),
            "ansible_python_interpreter": "/nonexistent/pyth\u00f6n3"}
    inventory.write_text(json.dumps({"all": {"children": {"san": {"hosts": {"h1": host}}}}}))
    runs = [(argv, 0, "") for argv in [["--version"], *HELP]] + [
        (["prepare", "--inventory", str(inventory)], 1, "missing: host check exited 127: /nonexistent/pyth\\xf6n3"),
        (["lab", "status", "--state-dir", str(state)], 1, "no lab in " + str(tmp_path / "l\\xe4b")),
        (["lab", "down", "--state-dir", str(state)], 0, "no lab in " + str(tmp_path / "l\\xe4b")),
        (["lab", "ssh", "--state-dir", str(state), "lab1"], 2, "no lab in " + str(tmp_path / "l\\xe4b")),
        (["lab", "up", "--hosts", "0", "--state-dir", str(state)], 2, "--hosts must be 1.."),
        (["lab", "run", "--hosts", "0", "--state-dir", str(state)], 2, "no lab in " + str(tmp_path / "l\\xe4b")),
    ]
    for argv, status, said in runs:
        result = _san_hil(*argv, env=env)
        assert (result.returncode, "Traceback" in result.stderr) == (status, False), (argv, result.stderr)
        assert said in result.stdout + result.stderr, (argv, result.stdout, result.stderr)


# --- progress through logging: san-hil shows it on stderr ------------------------------------------------


def test_progress_is_on_stderr_and_verbose_shows_debug_records(tmp_path: Path) -> None:
    result = _san_hil("lab", "down", "--state-dir", str(tmp_path / "none"))
    assert result.returncode == 0 and result.stdout == ""
    assert re.fullmatch(rf"\[ +\d+\.\ds\] host: no lab in {re.escape(str(tmp_path))}/none \(no state\.json\): "
                        r"nothing to stop\n", result.stderr), result.stderr
    inventory = _two_local_hosts(tmp_path)
    quiet = _san_hil("prepare", "--inventory", str(inventory), "--limit", "h1")
    verbose = _san_hil("-v", "prepare", "--inventory", str(inventory), "--limit", "h1")
    after = _san_hil("prepare", "--inventory", str(inventory), "--limit", "h1", "-v")  # -v after the command
    assert quiet.returncode == verbose.returncode == after.returncode == 0
    assert quiet.stderr == "" and quiet.stdout.startswith("h1: ready")
    for result in (verbose, after):
        assert re.search(r"^\[ +\d+\.\ds\] h1: running the host check: .*hostcheck\.py$", result.stderr,
                         re.MULTILINE), result.stderr
