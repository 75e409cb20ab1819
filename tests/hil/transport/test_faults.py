"""A lab host in a broken world, over the real test sshd (issue 28): a full or read-only san_remote_tmp, a port
that never speaks SSH, a user whose login shell is dash, an agent stopped mid-test, sshd killed mid-suite.

Each must end in bounded time with a clear message, leave nothing behind (processes, partial directories,
leases: the next agent on the host takes the lease at once) and leave the next run clean. The mounts need
root (skipped otherwise, saying so); the rest runs as anyone.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from hil.controller.backend import HilBackend
from hil.controller.client import AgentError, agent_bundle
from hil.controller.leases import LeasePolicy, LeaseRequest
from hil.inventory import HostConfig
from hil.transport import COMPLETE_MARKER, TransportError, open_transport
from tests.support.shell_users import shell_user
from tests.support.silent_port import SilentPort, clean, run_session, write_session
from tests.support.sshd import SshServer, descendants, is_running, start_sshd, wait_until

pytestmark = pytest.mark.slow  # real sshd, mounts, nested pytest sessions

BOUND = 60.0  # seconds: every fault here ends well within it (a hang guard, not a timing assertion)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture(autouse=True)
def leaves_nothing_behind() -> Iterator[None]:
    """No process a test started outlives it (the session-wide sshd servers and their reapers excepted), and
    no paramiko thread is left running."""
    before = set(descendants(os.getpid()))

    def leftovers() -> list[str]:
        new = set(descendants(os.getpid())) - before
        return [f"{pid}: {cmdline(pid)}" for pid in sorted(new) if is_running(pid)
                and "[listener]" not in cmdline(pid) and "tests/support/sshd.py" not in cmdline(pid)]

    yield
    wait_until(lambda: not leftovers(), timeout=10.0)
    assert not leftovers()
    assert [t.name for t in threading.enumerate() if isinstance(t, paramiko.Transport)] == []


def fails(call: Callable[..., object], *args: object, **kwargs: object) -> str:
    with pytest.raises((TransportError, AgentError)) as info:
        call(*args, **kwargs)
    return str(info.value)


def backend(host: HostConfig, worker: str = "faults") -> HilBackend:
    """One host's agent, taking its lease without waiting: a lease left behind fails it at once."""
    request = LeaseRequest(worker=worker, run=f"run-of-{worker}")
    return HilBackend([host], leases=LeasePolicy(request=request, timeout=0.0, notify=lambda line: None))


def next_run_is_clean(host: HostConfig) -> None:
    """A fresh agent starts on ``host``, holds nothing, and leaves its directory complete."""
    fresh = backend(host, "next-run")
    try:
        assert fresh.leaks() == []
        [script] = [w for w in shlex.split(fresh.agents[0].client.command) if w.endswith("/hil/agent/__main__.py")]
        directory = Path(script).parents[2]
        assert (directory / COMPLETE_MARKER).read_text() == f"{directory.name.rsplit('-', 1)[1]}\n"
    finally:
        fresh.close()


def no_partial_dirs(directory: Path) -> None:
    assert [p.name for p in directory.iterdir() if ".partial-" in p.name or ".stale-" in p.name] == []


# --- san_remote_tmp full or read-only ----------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount a tmpfs with the given options (``size=64k``, ``ro``); unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        if subprocess.run(["umount", str(point)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def test_a_full_remote_tmp_fails_the_push_and_leaves_nothing(sshd: SshServer,
                                                             tmpfs: Callable[[str], Path]) -> None:
    """Before, the push "succeeded" with every file and .complete 0 bytes, and every later start failed."""
    full = tmpfs("size=64k,mode=1777")  # the agent is about 400 KiB
    host = sshd.host_config(name="full", engine="emulator", loopback=True, extra={"san_remote_tmp": str(full)})
    files, _ = agent_bundle()
    started = time.monotonic()
    with open_transport(host, ssh_config=None) as transport:
        message = fails(transport.push, files)
    assert time.monotonic() - started < BOUND
    assert message.startswith(f"{transport.label}: push failed: cannot write {full}/pytest-san-agent-u")
    assert ".partial-" in message and message.endswith(": no space left on device")
    assert list(full.iterdir()) == []  # the partial copy is gone: the space is free again
    # The same through the backend: one error naming the host, the path and the errno.
    assert fails(backend, host).endswith(": no space left on device")
    assert list(full.iterdir()) == []
    subprocess.run(["mount", "-o", "remount,size=8m", str(full)], check=True)  # space freed: the next run works
    next_run_is_clean(host)
    no_partial_dirs(full)


def test_a_read_only_remote_tmp_is_named(sshd: SshServer, tmpfs: Callable[[str], Path]) -> None:
    read_only = tmpfs("ro,size=64k,mode=1777")
    host = sshd.host_config(name="ro", engine="emulator", loopback=True, extra={"san_remote_tmp": str(read_only)})
    with open_transport(host, ssh_config=None) as transport:
        message = fails(transport.push, {"agent.py": b"print('agent')\n"})
    assert message.startswith(f"{transport.label}: push failed: cannot create directory {read_only}/pytest-san-")
    assert message.endswith(": read-only file system")


# --- a port that never speaks SSH ----------------------------------------------------------------------------


def test_a_silent_port_fails_in_bounded_time_naming_it() -> None:
    with SilentPort() as port:
        host = HostConfig(name="silent", host="127.0.0.1", port=port.port, user="nobody")
        message = fails(open_transport, host, ssh_config=None, connect_timeout=5, banner_timeout=1)
    assert message == (f"silent (127.0.0.1:{port.port}): no SSH banner from 127.0.0.1:{port.port} within 1 s"
                       " (not an SSH server, or one too busy to answer)")
    # leaves_nothing_behind: no paramiko thread is left (one used to wait on, and log a traceback later)


def test_a_handshake_that_stalls_after_the_banner_is_named() -> None:
    """A server that sends its banner and then nothing: paramiko stops waiting for the key exchange and
    tries to log in ("No existing session"); the message says what happened, and its thread is joined."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            conn.sendall(b"SSH-2.0-OpenSSH_9.2 stalls\r\n")
            held.append(conn)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        host = HostConfig(name="stall", host="127.0.0.1", port=port, user="nobody")
        message = fails(open_transport, host, ssh_config=None, connect_timeout=1, banner_timeout=5)
    finally:
        server.join(5)
        for conn in held:
            conn.close()
    assert message == (f"stall (127.0.0.1:{port}): SSH handshake with 127.0.0.1:{port} did not finish within 1 s"
                       " of its banner (an overloaded host, or not an SSH server)")


def test_silent_port_sessions_end_without_internalerror(tmp_path: Path) -> None:
    """A pytest session whose 20 tests each meet the silent port and then fail (pytest parses their source):
    no INTERNALERROR, every failure the banner's. (``python -m tests.support.silent_port`` repeats it.)"""
    cases = 20
    write_session(tmp_path, cases)
    with SilentPort() as port:
        done = run_session(tmp_path, port.port)
    assert clean(done, port.port, cases), (done.stdout + done.stderr)[-3000:]


def test_the_hil_plugin_on_a_silent_port(pytester: pytest.Pytester) -> None:
    """The suite against a silent port with the default timeouts: its banner's wait, said once, no crash."""
    with SilentPort() as port:
        result = pytester.runpytest_subprocess(
            "--pyargs", "pytest_san.scenarios", "--san-backend=hil",
            f"--san-hosts=ssh://127.0.0.1:{port.port}?engine=emulator&loopback=1", timeout=300)
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert f"no SSH banner from 127.0.0.1:{port.port} within 15 s" in output


# --- a user whose login shell is dash ------------------------------------------------------------------------


def test_an_agent_runs_and_stops_for_a_dash_user(shared_sshd: SshServer) -> None:
    """useradd gives new users /bin/sh (dash): the agent starts, and stopping it leaves none of their processes
    (dash's kill refused the group kill's `--`, and a command's children lived on)."""
    user = shell_user("dash")
    python = shutil.which("python3", path="/usr/bin:/bin") or pytest.skip("no /usr/bin/python3 for other users")
    directory = Path(tempfile.mkdtemp(prefix="pytest-san-remote-"))
    try:
        os.chown(directory, user.pw_uid, user.pw_gid)
        host = shared_sshd.host_config(name=f"dash-{os.getpid()}", user=user.pw_name, engine="emulator",
                                       loopback=True, python_interpreter=python,
                                       extra={"san_remote_tmp": str(directory)})
        first = backend(host)
        try:
            assert first.leaks() == []
            stubborn = first.agents[0].transport.spawn(["sh", "-c", "sleep 300; echo late"])  # ignores stdin
            assert stubborn.pid is not None and theirs(user)
        finally:
            first.close()
        assert wait_until(lambda: not theirs(user), timeout=10), theirs(user)
        next_run_is_clean(host)
        assert wait_until(lambda: not theirs(user), timeout=10), theirs(user)
        no_partial_dirs(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def theirs(user: pwd.struct_passwd) -> list[str]:
    """The running processes of ``user`` that this session started (through its sshd: another session on the
    machine may use the same user)."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            if is_running(pid) and Path(f"/proc/{pid}").stat().st_uid == user.pw_uid:
                found.append(f"{pid}: {cmdline(pid)}")
        except OSError:  # gone meanwhile
            continue
    return found


# --- an agent stopped mid-test, sshd killed mid-suite ----------------------------------------------------------


def agent_pid(live: HilBackend) -> int:
    pid = live.agents[0].client.hello["pid"]
    assert isinstance(pid, int) and is_running(pid)
    return pid


def test_an_agent_stopped_mid_test_fails_the_call_naming_it(sshd: SshServer, remote_tmp: Path) -> None:
    """SIGSTOP (a debugger, a frozen host): the call fails after its timeout naming host and agent, closing
    ends the agent (TERM, then CONT so that it acts on it) and frees its lease."""
    host = sshd.host_config(name="stopped", engine="emulator", loopback=True,
                            extra={"san_remote_tmp": str(remote_tmp)})
    live = backend(host)
    pid = agent_pid(live)
    try:
        live.agents[0].client.call_timeout = 2.0
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        message = fails(live.leaks)
        assert time.monotonic() - started < BOUND
        assert message.startswith(f"host stopped (127.0.0.1:{sshd.port}, engine emulator): agent gone while waiting"
                                  " for leaks (request 1): ")
        assert "sent no complete line within 2 s" in message
    finally:
        started = time.monotonic()
        live.close()
        assert time.monotonic() - started < BOUND
    assert wait_until(lambda: not is_running(pid), timeout=10)
    next_run_is_clean(host)
    no_partial_dirs(remote_tmp)


def test_sshd_killed_mid_suite(tmp_path: Path, remote_tmp: Path) -> None:
    """The host's sshd dies (every sshd process, the agent spared): the next call fails naming the lost
    connection, the agent exits on its closed stdin, a new connection is refused by name, and once sshd is
    back the next run is clean (its lease free)."""
    (tmp_path / "sshd").mkdir()
    (tmp_path / "sshd-again").mkdir()
    server = start_sshd(tmp_path / "sshd")
    try:
        host = server.host_config(name="killed", engine="emulator", loopback=True,
                                  extra={"san_remote_tmp": str(remote_tmp)})
        live = backend(host)
        pid = agent_pid(live)
        try:
            for sshd_pid in server.processes():
                if cmdline(sshd_pid).startswith("sshd"):
                    os.kill(sshd_pid, signal.SIGKILL)
            message = fails(live.leaks)
            assert message.startswith(f"host killed (127.0.0.1:{server.port}, engine emulator): ")
            assert "the SSH connection was lost" in message or "cannot reach the agent" in message
        finally:
            live.close()
        assert wait_until(lambda: not is_running(pid), timeout=20), "the agent outlived its connection"
        assert fails(backend, host).endswith(
            f"unreachable: connection refused by 127.0.0.1:{server.port} (is sshd running there? right port?)")
    finally:
        server.stop()
    again = start_sshd(tmp_path / "sshd-again")
    try:
        next_run_is_clean(again.host_config(name="killed", engine="emulator", loopback=True,
                                            extra={"san_remote_tmp": str(remote_tmp)}))
    finally:
        again.stop()
    no_partial_dirs(remote_tmp)
