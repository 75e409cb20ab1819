"""Lab hosts shared by several users, over a real OpenSSH server as two real users (and root).

Each user's agent goes to a place of its own; the lease on a host excludes across users (the NIC is one):
any user takes a free lease, none can plant, break or steal another's, and a holder that dies frees it at
once. The hosts here use the defaults (no ``san_remote_tmp``: /tmp), as a team's lab host does; their names
are this run's own, so that no other run on the machine meets them.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.agent import lease
from hil.controller.backend import HilBackend
from hil.controller.client import push_agent
from hil.controller.leases import LeasePolicy, LeaseRequest, LeaseTimeout
from hil.inventory import HostConfig
from hil.transport import open_transport
from tests.support.sshd import SshServer, is_running, wait_until
from tests.support.users import other_users


@pytest.fixture(scope="module")
def users() -> list[pwd.struct_passwd]:
    return other_users()


@pytest.fixture
def host_name() -> str:
    return f"shared-{uuid.uuid4().hex[:10]}"


def _host(sshd: SshServer, user: str, name: str) -> HostConfig:
    return sshd.host_config(name=name, user=user, engine="emulator", loopback=True)


def _backend(host: HostConfig, worker: str, timeout: float = 0.0) -> HilBackend:
    request = LeaseRequest(worker=worker, run=f"run-of-{worker}")
    return HilBackend([host], leases=LeasePolicy(request=request, timeout=timeout, notify=lambda line: None))


@pytest.fixture(autouse=True)
def _no_pushes_left(users: list[pwd.struct_passwd]) -> Iterator[None]:
    """The agents the test pushed as the other users are removed afterwards (root's own stay, reused)."""
    yield
    for user in users:
        for path in Path("/tmp").glob(f"pytest-san-agent-u{user.pw_uid}-*"):
            if path.stat().st_uid == user.pw_uid:
                shutil.rmtree(path, ignore_errors=True)


def test_each_user_pushes_the_agent_to_a_place_of_their_own(shared_sshd: SshServer, users: list[pwd.struct_passwd],
                                                             host_name: str) -> None:
    places = {}
    for user in ("root", *(u.pw_name for u in users)):  # root first, as on the machine the issue was found on
        with open_transport(_host(shared_sshd, user, host_name), ssh_config=None) as transport:
            places[user], _ = push_agent(transport)
    assert len(set(places.values())) == 3
    for user, place in places.items():
        uid = pwd.getpwnam(user).pw_uid
        st = os.stat(place)
        assert Path(place).parent == Path("/tmp") and f"-u{uid}-" in Path(place).name
        assert st.st_uid == uid and st.st_mode & 0o077 == 0  # theirs, and no one else's to change
    # every user's agent runs, one host name each (the lease of one name is one user's at a time)
    backends = [_backend(_host(shared_sshd, u.pw_name, f"{host_name}-{u.pw_name}"), u.pw_name) for u in users]
    try:
        assert [b.leaks() for b in backends] == [[], []]
    finally:
        for backend in backends:
            backend.close()


def test_a_lease_excludes_across_users(shared_sshd: SshServer, users: list[pwd.struct_passwd],
                                       host_name: str) -> None:
    alice, bob = (u.pw_name for u in users)
    holder = _backend(_host(shared_sshd, alice, host_name), "alice-worker")
    try:
        for user in (bob, "root"):
            with pytest.raises(LeaseTimeout) as err:
                _backend(_host(shared_sshd, user, host_name), f"{user}-worker")
            assert f"host {host_name} is leased by worker alice-worker of run run-of-alice-worker on " in str(err.value)
            assert f" of user {alice} (uid {pwd.getpwnam(alice).pw_uid})" in str(err.value)
    finally:
        holder.close()
    # free the moment its holder let go, for any user: a single try, no waiting
    taker = _backend(_host(shared_sshd, bob, host_name), "bob-worker")
    taker.close()


_MEDDLE = r"""
import errno, json, os, signal, socket, sys
name, pid = sys.argv[1], int(sys.argv[2])
address = b"\0" + name.encode()
tried = {}
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.bind(address)  # take the name over
    tried["bind"] = "bound"
except OSError as exc:
    tried["bind"] = errno.errorcode[exc.errno]
s.close()
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(address)  # hang on to the holder, then drop it
c.shutdown(socket.SHUT_RDWR)
c.close()
for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
        os.kill(pid, sig)  # end the holder
        tried[str(sig)] = "sent"
    except OSError as exc:
        tried[str(sig)] = errno.errorcode[exc.errno]
print(json.dumps(tried))
"""


def test_no_user_can_break_or_steal_another_users_lease(shared_sshd: SshServer, users: list[pwd.struct_passwd],
                                                        host_name: str) -> None:
    alice, bob = (u.pw_name for u in users)
    holder = _backend(_host(shared_sshd, alice, host_name), "alice-worker")
    try:
        name = lease.lease_name("/tmp", host_name)
        record = lease.read_holder(name)
        assert record is not None and record["user"] == alice and record["worker"] == "alice-worker"
        with open_transport(_host(shared_sshd, bob, host_name), ssh_config=None) as transport:
            done = transport.run(["/usr/bin/python3", "-c", _MEDDLE, name, str(record["agent_pid"])], timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"bind": "EADDRINUSE", str(signal.SIGTERM): "EPERM",
                                           str(signal.SIGKILL): "EPERM"}
        assert holder.leaks() == []  # alice's agent serves on
        assert lease.read_holder(name) == record  # and holds the lease, untouched
        # Nothing anyone leaves in /tmp stands for a lease: older agents' lock file names, planted as bob's
        planted = Path(f"/tmp/pytest-san-lease-{host_name}.lock")
        planted.write_text("{}")
        os.chown(planted, *(pwd.getpwnam(bob)[2:4]))
        try:
            with pytest.raises(LeaseTimeout, match=f"leased by worker alice-worker .*user {alice}"):
                _backend(_host(shared_sshd, bob, host_name), "bob-worker")
        finally:
            planted.unlink()
    finally:
        holder.close()
    assert lease.read_holder(name) is None


def test_a_holder_that_dies_frees_the_lease_for_another_user(shared_sshd: SshServer,
                                                             users: list[pwd.struct_passwd],
                                                             host_name: str) -> None:
    alice, bob = (u.pw_name for u in users)
    holder = _backend(_host(shared_sshd, alice, host_name), "alice-worker")
    try:
        record = lease.read_holder(lease.lease_name("/tmp", host_name))
        assert record is not None
        pid = int(record["agent_pid"])
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not is_running(pid), timeout=60)
        taker = _backend(_host(shared_sshd, bob, host_name), "bob-worker")  # a single try: free at once
        try:
            assert lease.read_holder(lease.lease_name("/tmp", host_name))["user"] == bob  # type: ignore[index]
        finally:
            taker.close()
    finally:
        holder.close()
