"""The transports against a real OpenSSH server (tests/support/sshd.py) and as local subprocesses.

Both run on this machine, so what a command left behind is visible in /proc either way.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import getpass
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from hil.inventory import HostConfig
from hil.transport import (
    COMPLETE_MARKER,
    Channel,
    LocalTransport,
    SshChannel,
    SshTransport,
    Transport,
    TransportError,
    content_digest,
    open_transport,
)
from hil.transport.ssh import kill_script
from tests.support.shell_users import shell_user
from tests.support.sshd import SshServer, descendants, free_port, is_running, parent_pid, wait_until, write_keypair

# Echoes each line back; exits at EOF on stdin, as the agent does.
ECHO = [sys.executable, "-u", "-c", "import sys\nfor line in sys.stdin: sys.stdout.write('echo ' + line)"]
FILES = {"agent.py": b"print('agent')\n", "lib/util.py": b"X = 1\n", "lib/deep/more.py": b""}


def fingerprint(public_line: str) -> str:
    """OpenSSH's SHA256 fingerprint of an ``ssh-ed25519 AAAA...`` line."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_server(pid: int) -> bool:
    line = cmdline(pid)  # the session-wide sshd and its reaper may start during any test
    return "[listener]" in line or "tests/support/sshd.py" in line


@pytest.fixture(autouse=True)
def leaves_nothing_behind() -> Iterator[None]:
    """Every process a test started (commands, sshd sessions) is gone shortly after it ends, and every thread
    of its SSH connections."""
    before = set(descendants(os.getpid()))

    def leftovers() -> list[str]:
        new = set(descendants(os.getpid())) - before
        return [f"{pid}: {cmdline(pid)}" for pid in sorted(new) if is_running(pid) and not _is_server(pid)]

    yield
    wait_until(lambda: not leftovers(), timeout=5.0)
    assert not leftovers()
    # nor any paramiko thread: close() joins them (one that outlived its connection crashed pytest)
    assert [t.name for t in threading.enumerate() if isinstance(t, paramiko.Transport)] == []


SSH_LOGINS = ("ssh", "ssh-dash", "ssh-busybox")  # the sshd as us (bash), as a dash user, as a busybox sh user


@pytest.fixture(params=["local", *(pytest.param(p, marks=pytest.mark.slow) for p in SSH_LOGINS)])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    """Local subprocesses, or the real sshd logging in as us (bash), or as a user whose login shell is dash or
    busybox sh (tests/support/shell_users.py: root only) through the sshd other users can use."""
    extra = {"san_remote_tmp": str(tmp_path)}  # pushes land in the test's own directory
    if request.param == "local":
        host = HostConfig(name="here", host="localhost", connection="local", extra=extra)
    elif request.param == "ssh":
        server: SshServer = request.getfixturevalue("sshd")
        host = server.host_config(extra=extra)
    else:
        user = shell_user(request.param.removeprefix("ssh-"))
        server = request.getfixturevalue("shared_sshd")
        directory = Path(tempfile.mkdtemp(prefix="pytest-san-remote-"))  # theirs: pytest's own tree is not
        request.addfinalizer(lambda: shutil.rmtree(directory, ignore_errors=True))
        os.chown(directory, user.pw_uid, user.pw_gid)
        host = server.host_config(name=f"sshd-{user.pw_name}", user=user.pw_name,
                                  extra={"san_remote_tmp": str(directory)})
    with open_transport(host, ssh_config=None) as t:
        yield t


def remote_dir(transport: Transport) -> Path:
    """Where the transport's pushes land (its user's to write)."""
    return Path(transport.remote_tmp)


def python(transport: Transport) -> str:
    """An interpreter the transport's user may run: other users cannot reach ours (a venv under /root)."""
    if transport.host.connection == "local" or transport.host.user == getpass.getuser():
        return sys.executable
    return shutil.which("python3", path="/usr/bin:/bin") or pytest.skip("no /usr/bin/python3 for other users")


def echo(transport: Transport) -> list[str]:
    return [python(transport), *ECHO[1:]]


def login_uid(transport: Transport) -> int:
    return os.getuid() if transport.host.connection == "local" else pwd.getpwnam(transport.host.user or "").pw_uid


def test_the_login_shell_is_the_users(transport: Transport) -> None:
    """(The dash and busybox users are what they claim: sshd runs their commands through that shell.)"""
    if transport.host.connection == "local":
        pytest.skip("local commands have no login shell")
    shell = pwd.getpwnam(transport.host.user or "").pw_shell
    assert transport.run(["sh", "-c", 'echo "$SHELL"'], timeout=10).stdout == f"{shell}\n"  # as sshd set it


def fails(call: object, *args: object, **kwargs: object) -> str:
    """The message of the TransportError ``call`` raises."""
    assert callable(call)
    with pytest.raises(TransportError) as info:
        call(*args, **kwargs)
    return str(info.value)


# --- both transports -------------------------------------------------------------------------------


def test_run_returns_status_output_and_quotes_arguments(transport: Transport) -> None:
    result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    tricky = ["a b", "$HOME", "it's", "*", "; rm -rf /", ""]
    result = transport.run([python(transport), "-c", "import sys; print(sys.argv[1:])", *tricky], timeout=10)
    assert result.stdout == f"{tricky}\n"


def test_run_of_a_missing_program_is_status_127(transport: Transport) -> None:
    assert transport.run(["no-such-program-here"], timeout=10).returncode == 127


def test_run_of_a_file_that_is_no_program_is_status_126(transport: Transport) -> None:
    script = remote_dir(transport) / "not-executable"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    result = transport.run([str(script)], timeout=10)
    assert result.returncode == 126 and "ran" not in result.stdout  # as a shell reports it


def test_run_past_its_timeout_fails_and_stops_the_command(transport: Transport) -> None:
    message = fails(transport.run, ["sleep", "7.25"], timeout=0.5)
    assert message.startswith(f"{transport.label}: `sleep 7.25` did not finish within 0.5 s")
    # leaves_nothing_behind checks that the sleep is gone


def test_push_reuses_the_content_addressed_directory(transport: Transport) -> None:
    where = transport.push(FILES)
    here, uid = remote_dir(transport), login_uid(transport)
    assert where == f"{here}/pytest-san-agent-u{uid}-{content_digest(FILES)}"  # each user's own name
    assert re.fullmatch(r"pytest-san-agent-u[0-9]+-[0-9a-f]{16}", Path(where).name)
    for path, data in FILES.items():
        assert (Path(where) / path).read_bytes() == data
    assert (Path(where) / COMPLETE_MARKER).read_text() == f"{content_digest(FILES)}\n"  # what reuse compares
    assert Path(where).stat().st_uid == uid and Path(where).stat().st_mode & 0o777 == 0o700
    stamps = {p: p.stat().st_mtime_ns for p in Path(where).rglob("*")}

    assert transport.push(dict(reversed(FILES.items()))) == where  # order does not matter
    assert {p: p.stat().st_mtime_ns for p in Path(where).rglob("*")} == stamps  # untouched

    changed = transport.push({**FILES, "lib/util.py": b"X = 2\n"})
    assert changed != where and (Path(changed) / "lib/util.py").read_bytes() == b"X = 2\n"
    assert transport.push(FILES, name="other").startswith(f"{here}/other-")
    assert sorted(p.name for p in here.iterdir()) == sorted(  # no staging directory left
        Path(p).name for p in (where, changed, f"other-u{uid}-{content_digest(FILES)}")
    )


def plant(path: Path, uid: int, mode: int = 0o700, marker: bytes | None = None) -> Path:
    """A directory at ``path`` owned by ``uid``, with ``marker`` as its .complete, and a stale agent.py."""
    path.mkdir()
    (path / "agent.py").write_bytes(b"print('ag")
    if marker is not None:
        (path / COMPLETE_MARKER).write_bytes(marker)
    for entry in (path, *path.iterdir()):
        os.chown(entry, uid, -1)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("why", ["writable by others", "no marker", "empty marker", "another digest", "a file"])
def test_push_replaces_a_directory_of_ours_that_fails_the_check(transport: Transport, why: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A push that died half-way, or that a full disk emptied (0-byte files and marker, as a pipelined SFTP
    write that dropped its errors left them), is replaced, never reused."""
    final = remote_dir(transport) / f"pytest-san-agent-u{login_uid(transport)}-{content_digest(FILES)}"
    marker = {"writable by others": f"{content_digest(FILES)}\n".encode(), "no marker": None,
              "empty marker": b"", "another digest": b"0123456789abcdef\n", "a file": None}[why]
    if why == "a file":
        final.write_bytes(b"")
        os.chown(final, login_uid(transport), -1)
    else:
        plant(final, login_uid(transport), 0o777 if why == "writable by others" else 0o700, marker)
    assert transport.push(FILES) == str(final)
    assert (final / "agent.py").read_bytes() == FILES["agent.py"]
    assert (final / COMPLETE_MARKER).read_text() == f"{content_digest(FILES)}\n"
    assert final.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in remote_dir(transport).iterdir()] == [final.name]  # nothing set aside is left
    assert f"replacing {final}: " in caplog.text


def test_push_passes_over_a_name_another_user_took(transport: Transport, caplog: pytest.LogCaptureFixture) -> None:
    """Another user made a directory under our agent's name (they cannot be stopped in /tmp): it is left
    alone, named with its owner, and the agent goes to a name of our own, found again by the next push."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory that another user owns")
    here, uid = remote_dir(transport), login_uid(transport)
    other = 0 if uid != 0 else pwd.getpwnam("nobody").pw_uid
    squatted = plant(here / f"pytest-san-agent-u{uid}-{content_digest(FILES)}", other, 0o755)
    where = transport.push(FILES)
    assert re.fullmatch(rf"{squatted.name}-[0-9a-f]{{8}}", Path(where).name) and Path(where).parent == here
    assert Path(where).stat().st_uid == uid and (Path(where) / "agent.py").read_bytes() == FILES["agent.py"]
    assert (squatted / "agent.py").read_bytes() == b"print('ag"  # theirs, untouched
    owner = pwd.getpwuid(other).pw_name
    assert f"not using {squatted}: owned by uid {other} ({owner}), not by us (uid {uid})" in caplog.text
    assert transport.push(FILES) == where  # reused, not one more copy
    assert sorted(p.name for p in here.iterdir()) == sorted([squatted.name, Path(where).name])


def test_push_names_what_is_wrong_with_the_remote_tmp(transport: Transport, tmp_path: Path) -> None:
    here = remote_dir(transport)
    cases = {
        "relative/tmp": "san_remote_tmp 'relative/tmp' is a relative path: give an absolute directory on the host",
        f"{here}/missing": f"san_remote_tmp '{here}/missing' does not exist on the host",
        f"{here}/a-file": f"san_remote_tmp '{here}/a-file' is not a directory on the host",
    }
    (here / "a-file").write_text("")
    for path, expected in cases.items():
        transport.host = dataclasses.replace(transport.host, extra={"san_remote_tmp": path})
        assert fails(transport.push, FILES).startswith(f"{transport.label}: {expected}")


@pytest.mark.parametrize("where", ["the remote tmp", "its parent"])
def test_push_refuses_a_remote_tmp_others_can_rename_things_in(transport: Transport, where: str) -> None:
    """In a directory others may write to and that is not sticky, another user can move our agent away and
    put theirs in its place: refused, naming the directory; sticky (as /tmp is), it is fine."""
    shared = remote_dir(transport) / "shared"
    shared.mkdir()
    tmp = shared if where == "the remote tmp" else shared / "mine"
    if tmp != shared:
        tmp.mkdir()
    os.chown(tmp, login_uid(transport), -1)
    shared.chmod(0o777)
    transport.host = dataclasses.replace(transport.host, extra={"san_remote_tmp": str(tmp)})
    message = fails(transport.push, FILES)
    assert message.startswith(f"{transport.label}: san_remote_tmp '{tmp}': {shared} is writable by others and"
                              " not sticky (mode 777): another user could move the agent's directory away")
    assert f"chmod +t {shared}" in message and list(tmp.iterdir()) == []
    shared.chmod(0o1777)
    assert Path(transport.push(FILES)).parent == tmp


def test_push_rejects_paths_outside_its_directory(transport: Transport) -> None:
    for bad in ("/etc/passwd", "../x", "a//b", "a/./b", COMPLETE_MARKER):
        with pytest.raises(ValueError):
            transport.push({bad: b""})


def test_spawn_talks_and_closing_the_channel_ends_the_command(transport: Transport) -> None:
    channel = transport.spawn(echo(transport))
    running = channel.alive  # (a local, so that mypy does not narrow the property for good)
    assert channel.pid is not None and running
    channel.write(b"one\ntwo\n")
    assert channel.readline(timeout=10) == b"echo one\n"
    assert channel.readline(timeout=10) == b"echo two\n"
    channel.close()
    channel.close()  # idempotent
    assert not channel.alive
    # The process is gone, as the host itself sees it.
    assert transport.run(["sh", "-c", f"kill -0 {channel.pid}"], timeout=10).returncode != 0


def test_closing_ends_a_command_that_ignores_stdin(transport: Transport) -> None:
    channel = transport.spawn(["sh", "-c", "sleep 300; echo late"])
    assert channel.pid is not None
    started = time.monotonic()
    channel.close(grace=0.2)
    assert time.monotonic() - started < 120  # it was stopped, not waited for
    assert not channel.alive and not is_running(channel.pid)


SHELLS = {"dash": ["dash"], "bash": ["bash"], "busybox sh": ["busybox", "sh"]}


@pytest.mark.parametrize("shell", sorted(SHELLS))
@pytest.mark.parametrize("signal_name", ["TERM", "KILL"])
def test_the_group_kill_works_under_each_shell(shell: str, signal_name: str) -> None:
    """The script that stops a command, run by each /bin/sh a lab host may have, ends its whole group: with
    `kill -TERM -- -PID`, dash ended only the group's leader and its children lived on."""
    argv = SHELLS[shell]
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    group = subprocess.Popen(["sh", "-c", "sleep 300; echo late"], start_new_session=True)
    try:
        assert wait_until(lambda: len(descendants(group.pid)) == 1, timeout=5)  # the sleep has started
        [child] = descendants(group.pid)
        done = subprocess.run([*argv, "-c", kill_script(group.pid, signal_name)], capture_output=True, text=True,
                              timeout=10, check=False)
        assert done.returncode == 0, done.stderr
        assert group.wait(10) == -getattr(signal, f"SIG{signal_name}")
        assert wait_until(lambda: not is_running(child), timeout=5), f"{shell} left the group's sleep running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group.pid, signal.SIGKILL)
        group.wait()


def test_closing_the_transport_ends_a_command_that_ignores_stdin(transport: Transport) -> None:
    """(The transport signalled its commands through itself, after marking itself closed: it could not, and
    a command that ignored its stdin lived on.)"""
    channel = transport.spawn(["sh", "-c", "sleep 300; echo late"])
    transport.close()
    assert channel.pid is not None and not is_running(channel.pid)
    # leaves_nothing_behind checks that the sleep is gone too


def test_readline_timeout_names_host_and_command(transport: Transport) -> None:
    channel = transport.spawn(["sleep", "30"])
    message = fails(channel.readline, timeout=0.2)
    assert message.startswith(f"{transport.label}: `sleep 30` sent no complete line within 0.2 s")
    channel.close(grace=0.2)


def test_end_of_output_reports_status_and_stderr(transport: Transport) -> None:
    script = "import sys; print('partial', end=''); sys.stderr.write('boom\\n'); sys.exit(4)"
    channel = transport.spawn([python(transport), "-c", script])
    message = fails(channel.readline, timeout=10)
    assert message.startswith(transport.label + ": ")
    assert "exit status 4" in message and "b'partial'" in message and message.endswith("boom")
    assert not channel.alive


def test_closing_the_transport_ends_what_it_spawned(transport: Transport) -> None:
    channels = [transport.spawn(echo(transport)) for _ in range(2)]
    transport.close()
    transport.close()
    assert all(c.pid is not None and not is_running(c.pid) for c in channels)
    assert fails(transport.run, ["true"], timeout=5) == f"{transport.label}: transport is closed"


def test_open_transport_picks_by_connection_and_checks_timeouts(sshd: SshServer) -> None:
    local = HostConfig(name="here", host="localhost", connection="local")
    with open_transport(local, connect_timeout=1) as t:
        assert isinstance(t, LocalTransport) and t.label == "here (local)"
    with open_transport(sshd.host_config(), ssh_config=None, connect_timeout=5) as t:
        assert isinstance(t, SshTransport) and t.label == f"sshd (127.0.0.1:{sshd.port})"
    with pytest.raises(TypeError, match="conect_timeout"):
        open_transport(local, conect_timeout=1)


# --- SSH: refusing to connect ----------------------------------------------------------------------


@pytest.mark.parametrize("known", ["empty", "missing"])
def test_unknown_host_key_is_refused(sshd: SshServer, tmp_path: Path, known: str) -> None:
    known_hosts = tmp_path / "known_hosts"
    if known == "empty":
        known_hosts.touch()
    host = sshd.host_config(known_hosts=known_hosts)
    assert fails(open_transport, host, ssh_config=None) == (
        f"sshd (127.0.0.1:{sshd.port}): host key not in {known_hosts}: refusing to connect"
        f" (add it with ssh-keyscan after checking its fingerprint {fingerprint(sshd.host_public_key)})"
    )
    assert not known_hosts.exists() or known_hosts.read_text() == ""  # nothing was auto-added


def test_changed_host_key_is_refused_loudly(sshd: SshServer, tmp_path: Path) -> None:
    other = write_keypair(tmp_path / "other_host_key")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")
    message = fails(open_transport, sshd.host_config(known_hosts=known_hosts), ssh_config=None)
    assert message.startswith(f"sshd (127.0.0.1:{sshd.port}): HOST KEY MISMATCH, refusing to connect")
    assert fingerprint(sshd.host_public_key) in message and fingerprint(other) in message
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {known_hosts}" in message


def test_wrong_client_key_is_named(sshd: SshServer, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    public = write_keypair(wrong)
    message = fails(open_transport, sshd.host_config(key_file=wrong), ssh_config=None)
    assert message == (
        f"sshd (127.0.0.1:{sshd.port}): authentication as {sshd.user} failed:"
        f" the server accepted none of: {wrong} (ED25519 {fingerprint(public)})"
    )
    missing = tmp_path / "missing_key"
    assert f"cannot use key file {missing}" in fails(
        open_transport, sshd.host_config(key_file=missing), ssh_config=None
    )


def test_unreachable_host(sshd: SshServer) -> None:
    port = free_port()  # nothing listens there
    message = fails(open_transport, sshd.host_config(port=port), ssh_config=None)
    assert message == (
        f"sshd (127.0.0.1:{port}): unreachable: connection refused by 127.0.0.1:{port}"
        " (is sshd running there? right port?)"
    )


# --- SSH: the connection going away ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["sshd session killed", "socket shut down"])
def test_dropped_connection_fails_the_call_and_ends_the_command(sshd: SshServer, how: str) -> None:
    with open_transport(sshd.host_config(), ssh_config=None) as t:
        channel = t.spawn(ECHO)
        channel.write(b"ping\n")
        assert channel.readline(timeout=10) == b"echo ping\n"
        assert channel.pid is not None
        if how == "sshd session killed":
            session = parent_pid(channel.pid)
            assert session is not None and cmdline(session).startswith("sshd:")
            os.kill(session, signal.SIGKILL)
        else:
            assert isinstance(t, SshTransport) and t.paramiko_transport is not None
            sock = t.paramiko_transport.sock
            assert isinstance(sock, socket.socket)
            sock.shutdown(socket.SHUT_RDWR)
        message = fails(channel.readline, timeout=10)
        assert message.startswith(f"{t.label}: ") and "the SSH connection was lost" in message
        assert not channel.alive
        pid = channel.pid
        assert wait_until(lambda: not is_running(pid), timeout=5), "the remote command outlived its connection"
        assert fails(t.run, ["true"], timeout=5).startswith(f"{t.label}: the SSH connection was lost")
        t.connect()  # a lost connection is replaced by a fresh one
        assert t.run(["echo", "back"], timeout=10).stdout == "back\n"


# --- SSH: ~/.ssh/config and ProxyJump --------------------------------------------------------------


def write_config(tmp_path: Path, sshd: SshServer, target_jump: str | None) -> Path:
    config = tmp_path / "ssh_config"
    jump = f"    ProxyJump {target_jump}\n" if target_jump else ""
    config.write_text(
        f"Host target\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User {sshd.user}\n{jump}"
        f"    IdentityFile {sshd.client_key}\n"
        f"Host jump1 jump2\n    HostName 127.0.0.1\n    Port {sshd.port}\n    IdentityFile {sshd.client_key}\n"
    )
    return config


def accepted(sshd: SshServer) -> int:
    return sshd.log.read_text(errors="replace").count("Accepted publickey for")


@pytest.fixture
def no_agent_or_home_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Only the configured keys may work: no ssh-agent, no ~/.ssh/id_*.
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.mark.usefixtures("no_agent_or_home_keys")
def test_ssh_config_supplies_hostname_port_user_and_key(sshd: SshServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, sshd, target_jump=None)
    host = HostConfig(name="lab1", host="target", known_hosts=sshd.known_hosts)
    with open_transport(host, ssh_config=config) as t:
        assert t.label == f"lab1 (127.0.0.1:{sshd.port})"
        assert t.run(["id", "-un"], timeout=10).stdout == f"{sshd.user}\n"


@pytest.mark.usefixtures("no_agent_or_home_keys")
@pytest.mark.parametrize("jump", ["jump1", "jump1,jump2", "{user}@127.0.0.1:{port}"])
def test_proxy_jump_through_the_same_sshd(sshd: SshServer, tmp_path: Path, jump: str) -> None:
    jump = jump.format(user=sshd.user, port=sshd.port)  # the server logs in the user running the tests
    config = write_config(tmp_path, sshd, target_jump=jump)
    # The inline hop has no IdentityFile of its own: it falls back to the inventory key.
    host = HostConfig(name="lab1", host="target", key_file=sshd.client_key, known_hosts=sshd.known_hosts)
    before = accepted(sshd)
    with open_transport(host, ssh_config=config) as t:
        assert isinstance(t, SshTransport)
        assert t.jump_hosts == (f"127.0.0.1:{sshd.port}",) * (jump.count(",") + 1)
        assert t.run(["echo", "through"], timeout=10).stdout == "through\n"
        channel = t.spawn(ECHO)
        channel.write(b"hop\n")
        assert channel.readline(timeout=10) == b"echo hop\n"
    assert accepted(sshd) - before == len(t.jump_hosts) + 1  # one login per hop, one on the target


@pytest.mark.usefixtures("no_agent_or_home_keys")
def test_proxy_jump_failures_name_the_hop(sshd: SshServer, tmp_path: Path) -> None:
    closed = free_port()
    host = HostConfig(name="lab1", host="target", key_file=sshd.client_key, known_hosts=sshd.known_hosts)
    config = write_config(tmp_path, sshd, target_jump=f"127.0.0.1:{closed}")
    assert fails(open_transport, host, ssh_config=config) == (
        f"lab1 (127.0.0.1:{sshd.port}): jump host 127.0.0.1 (127.0.0.1:{closed}): unreachable:"
        f" connection refused by 127.0.0.1:{closed} (is sshd running there? right port?)"
    )
    # The jump host works, but the target behind it does not answer.
    unreachable = dataclasses.replace(host, port=closed)
    config = write_config(tmp_path, sshd, target_jump="jump1")
    message = fails(open_transport, unreachable, ssh_config=config)
    assert message.startswith(
        f"lab1 (127.0.0.1:{closed}): jump host jump1 (127.0.0.1:{sshd.port}):"
        f" could not open a connection to 127.0.0.1:{closed}"
    )


# --- Channel.readline: linear in the line's length --------------------------------------------------


class _Counting(bytearray):
    """A channel buffer that counts the bytes its searches for a newline look at."""

    scanned = 0

    def find(self, sub: bytes, start: int = 0) -> int:  # type: ignore[override]
        _Counting.scanned += len(self) - start
        return super().find(sub, start)


class _Fed(Channel):
    """A channel whose stdout is a list of chunks (no process)."""

    def __init__(self, chunks: list[bytes]) -> None:
        feed = iter(chunks)
        super().__init__("fed", "fed", lambda: next(feed, b""), lambda: b"")
        self._buffer = _Counting()

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close(self, grace: float = 0.0) -> None:
        self._closed = True

    @property
    def alive(self) -> bool:
        return False

    def _exit_status(self, wait: float) -> int | None:
        return 0


@pytest.mark.parametrize("mib", [1, 8])
def test_readline_looks_at_each_byte_of_a_long_line_once(mib: int) -> None:
    size, chunk = mib << 20, 4096  # as a pipe delivers it: many small chunks
    line = b"x" * (size - 1) + b"\n"
    channel = _Fed([line[i:i + chunk] for i in range(0, size, chunk)] + [b"next\n"])
    _Counting.scanned = 0
    assert channel.readline(timeout=60) == line
    assert channel.readline(timeout=10) == b"next\n"
    # Rescanning the buffer after every chunk looked at size**2 / (2 * chunk) bytes: 128 GiB for 8 MiB.
    assert _Counting.scanned <= size + len(b"next\n")


# --- SSH: a login shell that prints before the command starts ---------------------------------------


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    """A process of its own group, whose pid a noisy login prints: it must never be signalled."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def noisy_login(sshd: SshServer, tmp_path: Path, decoy: subprocess.Popen[bytes]) -> Iterator[HostConfig]:
    """A host whose login prints numbers and a banner before running the command (sshd's ``command=``
    option in authorized_keys, as a forced command or a chatty .bashrc would): first the decoy's pid,
    the way `echo $$` once reported the command's own."""
    key = tmp_path / "noisy_key"
    public = write_keypair(key, "noisy-login")
    login = (f"printf '%s\\n' {decoy.pid} 'Welcome to lab1' '  42  ' 'pytest-san-agent-pid 0 7'; "
             "printf 'last login: no newline '; eval \\\"$SSH_ORIGINAL_COMMAND\\\"")
    keys = sshd.directory / "authorized_keys"
    original = keys.read_text()
    keys.write_text(f'{original}command="{login}" {public}\n')
    try:
        yield sshd.host_config(name="noisy", key_file=key, extra={"san_remote_tmp": str(tmp_path)})
    finally:
        keys.write_text(original)


def test_login_noise_is_not_taken_for_the_pid(noisy_login: HostConfig, decoy: subprocess.Popen[bytes]) -> None:
    with open_transport(noisy_login, ssh_config=None) as t:
        channel = t.spawn(["sleep", "30"])  # ignores stdin: closing it must signal it
        assert isinstance(channel, SshChannel)
        pid = channel.pid
        assert pid is not None and pid != decoy.pid
        assert wait_until(lambda: cmdline(pid).startswith("sleep 30"), timeout=5)  # the shell has exec'd it
        assert b"Welcome to lab1" in channel.login_noise
        channel.close(grace=0.2)
        assert wait_until(lambda: not is_running(pid), timeout=5)
        result = t.run(["echo", "out"], timeout=10)
        assert (result.returncode, result.stdout) == (0, "out\n")  # the noise is not the command's output
        echo = t.spawn(ECHO)
        echo.write(b"hi\n")
        assert echo.readline(timeout=10) == b"echo hi\n"
    assert decoy.poll() is None, "closing a channel signalled the number the login shell printed"


def test_a_login_that_never_runs_the_command_names_host_and_noise(sshd: SshServer, tmp_path: Path) -> None:
    # (Not "echo 1": before the marker, a channel took 1 for its pid, and closing it could signal -1.)
    key = tmp_path / "motd_key"
    public = write_keypair(key, "motd-only")
    keys = sshd.directory / "authorized_keys"
    original = keys.read_text()
    keys.write_text(f'{original}command="echo 99999999; echo This account is closed" {public}\n')
    try:
        with open_transport(sshd.host_config(name="closed", key_file=key), ssh_config=None) as t:
            message = fails(t.spawn, ["sleep", "30"])
    finally:
        keys.write_text(original)
    assert message.startswith(f"{t.label}: `sleep 30` closed its output (exit status 0)")
    assert message.endswith("the login shell printed first: b'99999999\\nThis account is closed\\n'")
