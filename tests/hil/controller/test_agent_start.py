"""An agent that cannot start says why: its reason reaches the controller's error and the test report.

The real agent, with the verbs engine asked for a device that exists nowhere (``nosuch<pid>``): it fails at
start on any machine, RDMA devices or not, as it does on a lab host whose inventory names the wrong device.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hil.controller.client import AgentClient
from hil.controller.errors import AgentStartError
from hil.inventory import HostConfig
from hil.transport import open_transport
from tests.support.sshd import SshServer

# A verbs agent leases its device machine-wide, so two runs of these tests side by side (tox's parallel envs)
# would wait on each other's lease of one name: each run asks for a device of its own.
DEVICE = f"nosuch{os.getpid()}"
REASON = f"the agent could not start: the verbs engine (device '{DEVICE}'): NoRdmaDevice: "


def _start_fails(host: HostConfig) -> str:
    with open_transport(host, ssh_config=None) as transport, pytest.raises(AgentStartError) as caught:
        AgentClient(host, transport, start_timeout=60)
    return str(caught.value)


def test_a_local_agent_that_cannot_start_names_its_reason(tmp_path: Path) -> None:
    host = HostConfig(name="nodev", host="localhost", connection="local", engine="verbs", device=DEVICE,
                      extra={"san_remote_tmp": str(tmp_path)})
    message = _start_fails(host)
    first = message.splitlines()[0]
    assert first.startswith(f"host nodev (localhost:22, engine verbs): {REASON}"), message
    assert "Traceback" in message  # then the agent's own account, for whoever digs further


def test_an_agent_over_ssh_that_cannot_start_names_its_reason(sshd: SshServer, tmp_path: Path) -> None:
    host = sshd.host_config(name="nodev", engine="verbs", device=DEVICE, extra={"san_remote_tmp": str(tmp_path)})
    first = _start_fails(host).splitlines()[0]
    assert first.startswith(f"host nodev ({sshd.host}:{sshd.port}, engine verbs): {REASON}"), first


def test_the_reason_is_in_the_failing_tests_report(pytester: pytest.Pytester,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    host = {"ansible_connection": "local", "san_engine": "verbs", "san_device": DEVICE, "san_loopback": True,
            "san_remote_tmp": str(pytester.path)}
    monkeypatch.setenv("COLUMNS", "400")  # the short summary is cut at the terminal's width
    inventory = pytester.path / "lab.json"
    inventory.write_text(json.dumps({"all": {"children": {"san": {"hosts": {"nodev": host}}}}}))
    pytester.makepyfile(test_needs_a_host="def test_connect(san_switch):\n    san_switch.connect()\n")
    result = pytester.runpytest_subprocess("-ra", "--san-backend=hil",
                                           f"--san-inventory={inventory}")
    result.assert_outcomes(errors=1)
    # in the error's report, and on the one line of the short summary
    result.stdout.fnmatch_lines([f"san: the hil backend could not be built: host nodev (nodev:22, engine verbs): "
                                 f"{REASON}*",
                                 f"ERROR test_needs_a_host.py::test_connect - *{REASON}*"])
    assert "fixtures.py" not in result.stdout.str()  # the agent's account, not the controller's traceback


def test_a_failed_start_is_reported_once_and_ends_the_session(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Starting an agent that cannot start costs its start-up time and ends the same way every time: the
    # first test errors with the reason, and the session stops there, instead of one traceback per test
    # (issue 28: 214 errors). A san_requires marker asks for the backend in each test's setup.
    host = {"ansible_connection": "local", "san_engine": "verbs", "san_device": DEVICE, "san_loopback": True,
            "san_remote_tmp": str(pytester.path)}
    monkeypatch.setenv("COLUMNS", "400")
    inventory = pytester.path / "lab.json"
    inventory.write_text(json.dumps({"all": {"children": {"san": {"hosts": {"nodev": host}}}}}))
    pytester.makepyfile(test_two="""
        import pytest

        @pytest.mark.san_requires("verbs")
        def test_first(san_switch):
            pass

        @pytest.mark.san_requires("rdma_read")
        def test_second(san_provider):
            pass

        def test_third(san_provider):
            pass
    """)
    log_file = pytester.path / "hil.log"
    result = pytester.runpytest_subprocess("-ra", "--san-backend=hil",
                                           f"--san-inventory={inventory}", f"--log-file={log_file}",
                                           "--log-file-level=DEBUG")
    result.assert_outcomes(errors=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"ERROR test_two.py::test_first - *{REASON}*",
                                 "!*san: the hil backend could not be built: no SAN test can run (the error above)*!"])
    assert "test_second" not in result.stdout.str() and "test_third" not in result.stdout.str()
    records = log_file.read_text().splitlines()
    starts = [line for line in records if "hil.controller.client" in line and "starting the agent" in line]
    failures = [line for line in records if "hil.controller.client" in line and REASON in line]
    assert (len(starts), len(failures)) == (1, 1), records
