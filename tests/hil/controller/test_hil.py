"""The hil backend over a real OpenSSH server on 127.0.0.1 (engine emulator, loopback)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.controller.backend import HilBackend, combined_capabilities
from hil.controller.client import AgentError
from hil.inventory import HostConfig
from hil.transport import SshTransport, TransportError
from pytest_san import Access, Connection, Switch
from tests.support import readme
from tests.support.sshd import SshServer, free_port, is_running, wait_until, write_keypair

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]


def inventory(path: Path, host: HostConfig) -> Path:
    path.write_text(json.dumps({"all": {"children": {"san": {"hosts": {host.name: {
        "ansible_host": host.host, "ansible_port": host.port, "ansible_user": host.user,
        "ansible_ssh_private_key_file": str(host.key_file), "san_known_hosts": str(host.known_hosts),
        "san_engine": "emulator", "san_loopback": True}}}}}}))
    return path


@pytest.fixture
def lab_host(sshd: SshServer) -> HostConfig:
    return sshd.host_config(name="lab1", engine="emulator", loopback=True)


@pytest.fixture
def backend(lab_host: HostConfig) -> Iterator[HilBackend]:
    b = HilBackend([lab_host])
    yield b
    b.close()


def agent_pid(backend: HilBackend) -> int:
    pid = backend.agents[0].client.channel.pid
    assert pid is not None
    return pid


def _report(pytester: pytest.Pytester, *args: str) -> dict[str, object]:
    path = pytester.path / f"report-{len(list(pytester.path.glob('report-*')))}.json"
    pytester.runpytest_subprocess("--san-report", str(path), *args)
    report: dict[str, object] = json.loads(path.read_text())
    return report


# -- the suite and a downstream file, through SSH ----------------------------------------------------


def test_suite_over_ssh_passes_the_same_rules_as_in_process(pytester: pytest.Pytester,
                                                            lab_host: HostConfig) -> None:
    inv = inventory(pytester.path / "lab.json", lab_host)
    local = _report(pytester, "--pyargs", "pytest_san.scenarios")
    remote = _report(pytester, "--pyargs", "pytest_san.scenarios", "--san-backend=hil", f"--san-inventory={inv}")
    assert remote["backend"] == "hil"
    assert remote["rules"] == local["rules"]
    rules = remote["rules"]
    assert isinstance(rules, dict) and all(c["failed"] == 0 and c["passed"] > 0 for c in rules.values())
    outcomes = {t["nodeid"]: t["outcome"] for t in remote["tests"]}  # type: ignore[attr-defined]
    assert outcomes == {t["nodeid"]: t["outcome"] for t in local["tests"]}  # type: ignore[attr-defined]
    # The reference model ran in both, each at its backend's budget: the hil backend declares a lab's
    # (HilBackend.model_budget: 16 sequences of 20 steps), the emulator its own (the defaults: 100 of 40). Each
    # budget's deadline may stop it early on a loaded machine (CI once saw 60 of 100): it bounds the time, so the
    # steps of a sequence tell the budgets apart.
    for report, (most, steps) in ((remote, (16, 20)), (local, (100, 40))):
        model: dict[str, Any] = report["model"]  # type: ignore[assignment]
        assert 0 < model["sequences"] <= most and model["steps"] == steps * model["sequences"], model
        assert model["divergences"] == []


def test_downstream_file_over_ssh(pytester: pytest.Pytester, lab_host: HostConfig) -> None:
    inv = inventory(pytester.path / "lab.json", lab_host)
    pytester.makepyfile(test_downstream=(TESTS / "support" / "downstream_example.py").read_text(),
                        test_readme=readme.example())
    result = pytester.runpytest_subprocess("--san-backend=hil", f"--san-inventory={inv}")
    result.assert_outcomes(passed=2)  # the README's example and the downstream project's own test


def test_the_report_names_each_hosts_kernel(pytester: pytest.Pytester, lab_host: HostConfig) -> None:
    """The report (docs/downstream.md): "kernel" is each host's kernel release as its agent saw it;
    "kernel_resources" what the kernel's RDMA resource tracking showed, which an emulator-engine host does not
    read (the verbs engine does: lab)."""
    inv = inventory(pytester.path / "lab.json", lab_host)
    pytester.makepyfile(test_downstream=(TESTS / "support" / "downstream_example.py").read_text())
    report = _report(pytester, "--san-backend=hil", f"--san-inventory={inv}")
    assert report["kernel"] == {"lab1": os.uname().release}  # the sshd's host is this machine
    assert report["kernel_resources"] == {"lab1": {
        "tests": [], "session_end": None,
        "unavailable": "this host's engine does not read the kernel's RDMA resources"}}
    assert "kernel" not in _report(pytester)  # the emulator backend has no hosts


def test_broken_provider_hook_applies_over_ssh(pytester: pytest.Pytester, lab_host: HostConfig) -> None:
    """pytest_san_make_provider wraps the hil backend's providers too: the suite catches the bug there."""
    inv = inventory(pytester.path / "lab.json", lab_host)
    rules = _report(pytester, "--pyargs", "pytest_san.scenarios", "-p", "pytest_san.examples.broken_provider",
                    "--san-backend=hil", f"--san-inventory={inv}")["rules"]
    assert isinstance(rules, dict)
    assert {rule for rule, counts in rules.items() if counts["failed"]} == {"R6", "R7"}


# -- connection failures: one clear error naming the host --------------------------------------------


def test_unknown_host_key_is_refused(sshd: SshServer, lab_host: HostConfig, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(TransportError) as err:
        HilBackend([dataclasses.replace(lab_host, known_hosts=empty)])
    assert str(err.value).startswith("lab1 (127.0.0.1:") and "host key" in str(err.value)


def test_wrong_client_key_is_refused(lab_host: HostConfig, tmp_path: Path) -> None:
    stranger = tmp_path / "id_stranger"
    write_keypair(stranger)
    with pytest.raises(TransportError) as err:
        HilBackend([dataclasses.replace(lab_host, key_file=stranger)])
    assert str(err.value).startswith("lab1 (") and "auth" in str(err.value).lower()


def test_unreachable_host(lab_host: HostConfig) -> None:
    port = free_port()  # a port nobody listens on
    with pytest.raises(TransportError) as err:
        HilBackend([dataclasses.replace(lab_host, port=port)])
    assert str(err.value).startswith(f"lab1 (127.0.0.1:{port})")


def test_usage_error_shows_the_host_problem(pytester: pytest.Pytester, lab_host: HostConfig,
                                           tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = inventory(pytester.path / "lab.json", dataclasses.replace(lab_host, known_hosts=empty))
    pytester.makepyfile(test_one="def test_one(san_switch):\n    san_switch.connect()\n")
    result = pytester.runpytest_subprocess("--san-backend=hil", f"--san-inventory={inv}")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*lab1 (127.0.0.1:*host key*"])


# -- the agent or its connection going away mid-test --------------------------------------------------


def _registered_pair(backend: HilBackend) -> Connection:
    conn = Switch(backend).connect()
    a = conn.local
    buf = a.process.alloc(4096)
    a.provider.register_memory(a.socket, buf, Access.READ)
    return conn


def test_agent_killed_mid_test(backend: HilBackend) -> None:
    conn = _registered_pair(backend)
    pid = agent_pid(backend)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(AgentError) as err:
        conn.local.process.alloc(64)
    assert "host lab1 (127.0.0.1:" in str(err.value) and "agent" in str(err.value)
    assert wait_until(lambda: not is_running(pid), timeout=5)
    backend.reset()  # a fresh agent serves the next test
    assert agent_pid(backend) != pid
    assert backend.leaks() == []
    fresh = Switch(backend).connect()
    buf = fresh.local.process.alloc(64)
    handle = fresh.local.provider.register_memory(fresh.local.socket, buf, Access.READ)
    assert isinstance(handle, int)
    fresh.close()


def test_ssh_dropped_mid_test(backend: HilBackend) -> None:
    conn = _registered_pair(backend)
    pid = agent_pid(backend)
    transport = backend.agents[0].transport
    assert isinstance(transport, SshTransport) and transport.paramiko_transport is not None
    sock = transport.paramiko_transport.sock
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(AgentError) as err:
        conn.local.process.alloc(64)
    assert "host lab1 (127.0.0.1:" in str(err.value)
    # Its stdin closed with the connection: the agent released everything and exited.
    assert wait_until(lambda: not is_running(pid), timeout=10), "the agent outlived its SSH connection"
    backend.reset()
    assert backend.leaks() == []


def test_capabilities_are_what_every_host_offers() -> None:
    verbs = frozenset({"verbs", "rdma_read", "contiguous"})
    assert combined_capabilities([verbs, frozenset({"verbs", "rdma_read"})], 2) == {"verbs", "rdma_read", "hil"}
    assert "third_host" in combined_capabilities([verbs] * 3, 3)  # three verbs hosts, one node each
    emulated = combined_capabilities([frozenset({"emulator", "faults", "third_host"})], 3)
    assert emulated == {"faults", "third_host", "hil"}


def test_closing_the_backend_ends_the_agent(lab_host: HostConfig) -> None:
    backend = HilBackend([lab_host])
    _registered_pair(backend)
    pid = agent_pid(backend)
    backend.close()
    assert wait_until(lambda: not is_running(pid), timeout=10)


def test_agent_refuses_another_content_hash(backend: HilBackend) -> None:
    agent = backend.agents[0]
    directory = agent.client.command.split()[1].rsplit("/hil/", 1)[0]
    result = agent.transport.run([agent.host.python_interpreter, f"{directory}/hil/agent/__main__.py",
                                  "--engine", "emulator", "--hash", "0" * 16], timeout=60)
    assert result.returncode == 3 and "does not match the controller's" in result.stderr


def test_a_failed_test_carries_host_diagnostics(pytester: pytest.Pytester, lab_host: HostConfig) -> None:
    inv = inventory(pytester.path / "lab.json", lab_host)
    pytester.makepyfile(test_fails="def test_fails(san_switch):\n    san_switch.connect()\n    assert False\n")
    result = pytester.runpytest_subprocess("--san-backend=hil", f"--san-inventory={inv}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*san host diagnostics: lab1*", "*-- rdma link: rdma link show*",
                                 "*-- kernel log (tail)*"])


def test_killed_agent_fails_one_test_and_the_next_passes(pytester: pytest.Pytester, lab_host: HostConfig) -> None:
    inv = inventory(pytester.path / "lab.json", lab_host)
    pytester.makepyfile(test_kill='''
import os, signal

def test_a_kill(san_backend, san_switch):
    conn = san_switch.connect()
    os.kill(san_backend.agents[0].client.channel.pid, signal.SIGKILL)
    conn.local.process.alloc(64)

def test_b_after(san_switch):
    conn = san_switch.connect()
    conn.local.send(b"still here")
    assert conn.remote.recv(10) == b"still here"
''')
    result = pytester.runpytest_subprocess("--san-backend=hil", f"--san-inventory={inv}")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and outcomes.get("failed", 0) + outcomes.get("errors", 0) >= 1
    result.stdout.fnmatch_lines(["*AgentError: host lab1 (127.0.0.1:*agent gone*"])


# -- output that is not the protocol: skipped before the hello, fatal (and replaced) after it ------------


@pytest.fixture
def chatty_host(sshd: SshServer, tmp_path: Path) -> Iterator[HostConfig]:
    """A lab host whose login prints a banner and numbers before the command runs (authorized_keys
    ``command=``), and whose interpreter prints before the agent starts (as a sitecustomize might)."""
    key = tmp_path / "chatty_key"
    public = write_keypair(key, "chatty-login")
    # SFTP (the agent's push) is a subsystem: the login's chatter reaches only commands, as with a .bashrc.
    login = ("[ \\\"$SSH_ORIGINAL_COMMAND\\\" = internal-sftp ] && exec /usr/lib/openssh/sftp-server; "
             "printf '%s\\n' 4242 'Welcome to lab1'; eval \\\"$SSH_ORIGINAL_COMMAND\\\"")
    python = tmp_path / "chatty-python"
    python.write_text("#!/bin/sh\nprintf '%s\\n' 17 '{' '[1, 2]' '{\"id\": 1, \"result\": 5}' 'Python ready'\n"
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    keys = sshd.directory / "authorized_keys"
    original = keys.read_text()
    keys.write_text(f'{original}command="{login}" {public}\n')
    try:
        yield sshd.host_config(name="chatty", engine="emulator", loopback=True, key_file=key,
                               python_interpreter=str(python), extra={"san_remote_tmp": str(tmp_path)})
    finally:
        keys.write_text(original)


def test_output_before_the_hello_is_skipped(chatty_host: HostConfig) -> None:
    backend = HilBackend([chatty_host])
    try:
        client = backend.agents[0].client
        assert b"".join(client.noise) == b'17\n{\n[1, 2]\n{"id": 1, "result": 5}\nPython ready\n'
        conn = Switch(backend).connect()
        conn.local.send(b"through the noise")
        assert conn.remote.recv(17) == b"through the noise"
        conn.close()
        assert backend.leaks() == []
    finally:
        backend.close()


def test_no_hello_at_all_names_the_host_and_what_it_printed(lab_host: HostConfig, tmp_path: Path) -> None:
    python = tmp_path / "not-python"
    python.write_text("#!/bin/sh\necho 'python3: not configured on this host'\nexit 5\n")
    python.chmod(0o755)
    with pytest.raises(AgentError) as err:
        HilBackend([dataclasses.replace(lab_host, python_interpreter=str(python))])
    message = str(err.value)
    assert message.startswith("host lab1 (127.0.0.1:") and "exit status 5" in message
    assert message.endswith("before its hello it printed b'python3: not configured on this host\\n'")


def _inject(pid: int, line: bytes) -> None:
    """A line on the agent's stdout, as a stray print in the engine (or anything else) would put it."""
    with open(f"/proc/{pid}/fd/1", "wb") as out:
        out.write(line)


@pytest.mark.parametrize("stray", [b"stray 42\n", b'{"id": 999, "result": null}\n', b"[1, 2]\n",
                                   b'{"id": 1, "result": 1, "error": {}}\n'])
def test_a_stray_line_mid_session_stops_the_agent_and_reset_replaces_it(backend: HilBackend,
                                                                       stray: bytes) -> None:
    conn = _registered_pair(backend)
    pid = agent_pid(backend)
    client = backend.agents[0].client
    _inject(pid, stray)
    with pytest.raises(AgentError) as err:
        conn.local.process.alloc(64)
    message = str(err.value)
    assert message.startswith("host lab1 (127.0.0.1:") and repr(stray) in message  # the host and the line
    assert client.dead  # never trusted again: every later reply could belong to another call
    with pytest.raises(AgentError, match="agent is gone"):
        conn.local.process.alloc(64)
    assert wait_until(lambda: not is_running(pid), timeout=10), "the out-of-step agent was left running"
    backend.reset()  # a fresh agent serves the next test
    assert agent_pid(backend) != pid and not backend.agents[0].client.dead
    assert backend.leaks() == []
    fresh = Switch(backend).connect()
    fresh.local.send(b"in step")
    assert fresh.remote.recv(7) == b"in step"
    fresh.close()
