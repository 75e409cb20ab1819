"""``san-hil prepare`` against this machine (local transport) and a real sshd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hil.agent.hostcheck import SYS_IB
from hil.cli.main import main
from tests.support.sshd import SshServer, free_port


def _inventory(tmp_path: Path, **host: object) -> Path:
    path = tmp_path / "lab.json"
    path.write_text(json.dumps({"all": {"children": {"san": {"hosts": {"h1": host}}}}}))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(["prepare", *argv])
    return status, capsys.readouterr().out


def test_missing_device_netdev_and_gid_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if SYS_IB.is_dir():
        pytest.skip("this machine has RDMA devices: the 'no device' report cannot be provoked here")
    inv = _inventory(tmp_path, ansible_connection="local", san_netdev="nosuchnet0", san_device="rxe9")
    status, out = _run(capsys, "--inventory", str(inv))
    assert status == 1
    assert "h1: NOT READY" in out
    assert "missing: no RDMA device: /sys/class/infiniband is absent" in out
    assert "missing: san_netdev nosuchnet0 not found; netdevs: lo" in out


def test_json_report_lists_netdevs_and_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = _inventory(tmp_path, ansible_connection="local")
    _, out = _run(capsys, "--inventory", str(inv), "--json")
    (report,) = json.loads(out)
    assert report["host"] == "h1"
    assert any(nd["name"] == "lo" and "127.0.0.1/8" in nd["addresses"] for nd in report["netdevs"])
    assert len(report["memlock"]) == 2 and report["pyverbs"]


def test_emulator_host_over_ssh_is_ready(sshd: SshServer, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    inv = _inventory(tmp_path, ansible_host=sshd.host, ansible_port=sshd.port, ansible_user=sshd.user,
                     ansible_ssh_private_key_file=str(sshd.client_key), san_known_hosts=str(sshd.known_hosts),
                     san_engine="emulator")
    status, out = _run(capsys, "--inventory", str(inv))
    assert status == 0 and out.startswith("h1: ready")


def test_unreachable_host_is_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()  # a port nobody listens on
    inv = _inventory(tmp_path, ansible_host="127.0.0.1", ansible_port=port)
    status, out = _run(capsys, "--inventory", str(inv))
    assert status == 1 and f"missing: h1 (127.0.0.1:{port})" in out


def test_bad_inventory_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = _inventory(tmp_path, san_engine="verb")
    assert main(["prepare", "--inventory", str(inv)]) == 2
    err = capsys.readouterr().err
    assert str(inv) in err and "san_engine" in err and "'verb'" in err
