"""Agent, lease and SSH events go through ``logging`` (loggers under ``hil.``), so pytest's ``--log-file``
and ``log_cli`` show them; library code adds no handler."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from hil.transport import open_transport
from tests.support.sshd import SshServer


def test_log_file_and_log_cli_show_the_agents_start_and_stop(pytester: pytest.Pytester) -> None:
    host = {"ansible_connection": "local", "san_engine": "emulator", "san_loopback": True,
            "san_remote_tmp": str(pytester.path)}
    inventory = pytester.path / "lab.json"
    inventory.write_text(json.dumps({"all": {"children": {"san": {"hosts": {"logged": host}}}}}))
    pytester.makepyfile(test_uses_a_host="def test_connect(san_switch):\n    san_switch.connect()\n")
    log_file = pytester.path / "run.log"
    result = pytester.runpytest_subprocess(
        "--san-backend=hil", f"--san-inventory={inventory}",
        f"--log-file={log_file}", "--log-file-level=DEBUG", "--log-file-format=%(name)s %(levelname)s %(message)s",
        "-o", "log_cli=true", "--log-cli-level=INFO")
    result.assert_outcomes(passed=1)
    where = "host logged (logged:22, engine emulator)"
    records = log_file.read_text()
    started = re.search(rf"^hil\.controller\.client INFO {re.escape(where)}: agent started \(pid (\d+)\)$", records,
                        re.MULTILINE)
    assert started, records
    in_order = [
        "hil.controller.leases INFO lease acquired by worker main: hosts logged",
        f"hil.controller.backend DEBUG {where}: reset",
        "hil.controller.leases INFO lease released by worker main: hosts logged",
        f"hil.controller.client INFO {where}: agent stopped (pid {started[1]})",
    ]
    lines = records.splitlines()
    assert [line for line in lines if line in in_order] == in_order, records
    assert f"hil.controller.client DEBUG {where}: starting the agent: " in records
    # the live log on the terminal: the same events, at INFO
    result.stdout.fnmatch_lines([f"*INFO*{where}: agent started (pid {started[1]})*",
                                 f"*INFO*{where}: agent stopped (pid {started[1]})*"])
    assert "DEBUG" not in result.stdout.str()


def test_ssh_connect_auth_and_close_are_logged(sshd: SshServer, caplog: pytest.LogCaptureFixture) -> None:
    host = sshd.host_config(name="logged", engine="emulator")
    with caplog.at_level(logging.DEBUG, logger="hil.transport"), open_transport(host, ssh_config=None) as t:
        assert t.run(["true"], timeout=30).returncode == 0
    said = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    label = f"logged ({sshd.host}:{sshd.port})"
    assert ("hil.transport.ssh", "DEBUG", f"{label}: authenticated as {sshd.user} by public key") in said, said
    assert ("hil.transport.ssh", "INFO", f"{label}: SSH connected as {sshd.user}") in said
    assert said[-1] == ("hil.transport.ssh", "INFO", f"{label}: SSH connection closed")
    connecting = [m for n, level, m in said if "connecting to" in m]
    assert connecting and f"offering {sshd.client_key}" in connecting[0]


def test_a_failed_ssh_login_is_logged_with_its_reason(sshd: SshServer, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    host = sshd.host_config(name="logged", known_hosts=tmp_path / "empty_known_hosts")
    with caplog.at_level(logging.DEBUG, logger="hil.transport"), pytest.raises(Exception, match="host key"):
        open_transport(host, ssh_config=None)
    assert any(r.levelname == "WARNING" and "host key not in" in r.getMessage() for r in caplog.records)
