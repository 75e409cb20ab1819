"""Leases on lab hosts: held by the agent (an abstract socket), never stale, waited for, recorded; xdist."""

from __future__ import annotations

import dataclasses
import errno
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hil.agent import lease
from hil.controller.backend import BackendBroken, HilBackend
from hil.controller.client import AgentError, HostBusy
from hil.controller.leases import (
    LeasePolicy,
    Leaser,
    LeaseRefused,
    LeaseRequest,
    LeaseTimeout,
    describe_holder,
    hosts_per_worker,
)
from hil.inventory import HostConfig
from tests.support.lab_hosts import NAMES, start_pytest, write_inventory
from tests.support.sshd import is_running, wait_until

ROOT = Path(__file__).resolve().parents[3]
SIGN = 300  # seconds a sign of the runs started here may take: they start pytest and agents over SSH, under load
# A run that must wait for hosts until the test lets their holder go: its --san-lease-timeout outlasts every bound
# of the test itself (each sign, and each run's end, within SIGN), so that the waiting, not a race between the
# lease timeout and a loaded machine's start-up, decides the outcome (issue 39: 123 s of a first run beat 120 s).
WAITS_FOR_THE_TEST = 4 * SIGN


# --- the agent's side: an abstract socket held for the process's life ---------------------------------


def test_a_lease_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    held, record = lease.take(str(tmp_path), "lab1", {"worker": "gw1", "run": "r1", "controller": "ctl", "pid": 7})
    assert held is not None and record["worker"] == "gw1" and record["agent_pid"] == os.getpid()
    assert record["uid"] == os.geteuid() and record["user"] and record["lease"] == held.name
    again, holder = lease.take(str(tmp_path), "lab1", {"worker": "gw2"})
    # The kernel names the holder (this process: pytest, no agent, so what it answers is not believed)
    assert again is None and holder["agent_pid"] == os.getpid() and holder["uid"] == os.geteuid()
    assert holder["agent"] is False and "pytest" in holder["command"] and "worker" not in holder
    other, _ = lease.take(str(tmp_path), "lab2", {})  # another host name, another lease
    assert other is not None
    elsewhere, _ = lease.take(str(tmp_path / "x"), "lab1", {})  # another scope (san_remote_tmp), another lease
    assert elsewhere is not None
    held.release()
    after, record = lease.take(str(tmp_path), "lab1", {"worker": "gw2"})
    assert after is not None and record["worker"] == "gw2"
    for taken in (after, other, elsewhere):
        taken.release()
    assert lease.read_holder(lease.lease_name(str(tmp_path), "lab1")) is None


def test_an_agent_holder_answers_with_its_record(tmp_path: Path) -> None:
    """A holder whose command line is an agent's: its claims (worker, run, since...) beside the kernel's facts."""
    agent = tmp_path / "tree" / "hil" / "agent" / "__main__.py"
    agent.parent.mkdir(parents=True)
    agent.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from hil.agent import lease
        held, _ = lease.take({str(tmp_path)!r}, "lab1", {{"worker": "gw1", "run": "r1", "controller": "ctl",
                                                          "pid": 7, "user": "root", "uid": 0}})
        print("held" if held else "busy", flush=True)
        time.sleep(300)
    """))
    holder = subprocess.Popen([sys.executable, str(agent)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        busy, record = lease.take(str(tmp_path), "lab1", {"worker": "gw2"})
        assert busy is None and record["agent"] is True and record["agent_pid"] == holder.pid
        assert {k: record[k] for k in ("worker", "run", "controller", "pid", "host")} == {
            "worker": "gw1", "run": "r1", "controller": "ctl", "pid": 7, "host": "lab1"}
        assert record["uid"] == os.geteuid() and record["since"]
        assert describe_holder(record).startswith(f"worker gw1 of run r1 on ctl (pid 7) since {record['since']}, "
                                                  f"its agent pid {holder.pid} of user ")
    finally:
        holder.kill()
        holder.wait()


def test_a_lease_ends_with_its_process(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(ROOT)!r})
            from hil.agent import lease
            held, _ = lease.take({str(tmp_path)!r}, "lab1", {{"worker": "doomed"}})
            print("held" if held else "busy", flush=True)
            time.sleep(300)
        """)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        busy, record = lease.take(str(tmp_path), "lab1", {})
        assert busy is None and record["agent_pid"] == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        free, _ = lease.take(str(tmp_path), "lab1", {"worker": "next"})  # at once: nothing to clean up
        assert free is not None
        free.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_that_does_not_answer_is_still_named_by_the_kernel(tmp_path: Path) -> None:
    name = lease.lease_name(str(tmp_path), "lab1")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squatter:
        squatter.bind(b"\0" + name.encode())
        squatter.listen(1)  # never accepts, never says who it is
        busy, record = lease.take(str(tmp_path), "lab1", {})
    assert busy is None and record["agent_pid"] == os.getpid() and record["uid"] == os.geteuid()
    assert record["unanswered"] == "it did not say who it is within 2 s"
    assert describe_holder(record).startswith("a process that is no pytest-san agent on lease ")


def test_lease_names() -> None:
    name = lease.lease_name("/tmp", "lab1")
    assert name.startswith(lease.PREFIX) and name.endswith("/lab1") and len(name) < 108
    assert lease.lease_name("/tmp/", "lab1") == name  # one directory, one scope
    assert lease.lease_name("/srv/san", "lab1") != name and lease.lease_name("/tmp", "lab2") != name
    # a verbs agent's lease is its device's: no host name, no scope
    assert lease.lease_name("/tmp", "lab1", "verbs", "rxe0", 1) == lease.lease_name("/srv", "lab2", "verbs", "rxe0", 1)
    assert lease.lease_name("/tmp", "lab1", "verbs", "rxe0", 1) == "pytest-san-lease/verbs/rxe0/1"
    assert lease.lease_name("/tmp", "lab1", "verbs", "mlx5_0", 2) != lease.lease_name("/tmp", "lab1", "verbs",
                                                                                      "mlx5_0", 1)
    odd = lease.lease_name("/tmp", "../x y" * 40)
    assert len(odd) < 108 and " " not in odd and odd != lease.lease_name("/tmp", "__x_y" * 40)


def test_a_lease_that_cannot_be_taken_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoUnixSockets(socket.socket):
        def bind(self, address: Any) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(lease.socket, "socket", NoUnixSockets)
    held, record = lease.take(str(tmp_path), "lab1", {})
    assert held is None
    assert record["refused"] == (f"lease {lease.lease_name(str(tmp_path), 'lab1')!r} of host lab1 cannot be "
                                 f"taken: Permission denied")


def test_a_refused_lease_reaches_the_controller_naming_the_host() -> None:
    def start(host: HostConfig) -> str:
        raise HostBusy(host.name, {"refused": "lease 'x' of host h1 cannot be taken: Permission denied"}, "busy")

    leaser: Leaser[str] = Leaser(LeasePolicy(timeout=30, notify=lambda line: None), start, lambda a: None)
    with pytest.raises(LeaseRefused) as err:
        leaser.acquire([_host("h1")])  # at once: waiting would not help
    assert str(err.value) == ("san: cannot lease host h1 (127.0.0.1:22): lease 'x' of host h1 cannot be taken: "
                              "Permission denied")


# --- the controller's side -------------------------------------------------------------------------------


def _host(name: str, engine: str = "emulator", loopback: bool = False) -> HostConfig:
    return HostConfig(name=name, host="127.0.0.1", engine=engine, loopback=loopback)  # type: ignore[arg-type]


def test_hosts_per_worker() -> None:
    emu = [_host("a"), _host("b")]
    verbs = [_host("c", "verbs"), _host("d", "verbs"), _host("e", "verbs")]
    assert hosts_per_worker(emu, None) == hosts_per_worker(emu, "auto") == 1
    assert hosts_per_worker(verbs, "auto") == 2  # a pair
    assert hosts_per_worker([_host("c", "verbs", loopback=True)], "auto") == 1
    assert hosts_per_worker(verbs, "all") == 3 and hosts_per_worker(verbs, "3") == 3
    for bad in ("0", "two"):
        with pytest.raises(ValueError, match="hosts per worker"):
            hosts_per_worker(verbs, bad)


class _FakeLab:
    """start(host) for Leaser: a host in ``busy`` is leased by someone else."""

    def __init__(self, busy: dict[str, dict[str, Any]]) -> None:
        self.busy = busy
        self.open: set[str] = set()
        self.now = 0.0
        self.lines: list[str] = []

    def start(self, host: HostConfig) -> str:
        if host.name in self.busy or host.name in self.open:
            raise HostBusy(host.name, self.busy.get(host.name, {}), f"{host.name} busy")
        self.open.add(host.name)
        return host.name

    def close(self, name: str) -> None:
        self.open.remove(name)

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def leaser(self, count: int, timeout: float = 10.0, first: int = 0) -> Leaser[str]:
        policy = LeasePolicy(request=LeaseRequest(worker="gw0", run="r"), count=count, timeout=timeout,
                             notify=self.lines.append, first=first)
        return Leaser(policy, self.start, self.close, clock=lambda: self.now, sleep=self.sleep)


def test_leaser_takes_the_first_free_hosts_from_its_offset() -> None:
    hosts = [_host("h1"), _host("h2"), _host("h3"), _host("h4")]
    lab = _FakeLab({"h2": {"worker": "gw9", "run": "other", "controller": "ctl", "since": "t0"}})
    assert lab.leaser(2).acquire(hosts) == ["h1", "h3"]
    assert lab.leaser(1, first=3).acquire(hosts) == ["h4"]
    assert lab.lines == []  # nothing to wait for


def test_leaser_gives_back_a_partial_set_waits_visibly_and_times_out_naming_the_holder() -> None:
    hosts = [_host("h1"), _host("h2")]
    holder = {"worker": "gw1", "run": "abc", "controller": "ctl", "pid": 42, "since": "2026-01-01T00:00:00"}
    lab = _FakeLab({"h2": holder})
    with pytest.raises(LeaseTimeout) as err:
        lab.leaser(2, timeout=5).acquire(hosts)
    assert lab.open == set()  # h1 was given back every round: no half-held pair while waiting
    assert lab.lines == ["san: waiting for host h2, leased by worker gw1 of run abc on ctl (pid 42) since "
                         "2026-01-01T00:00:00 (up to 5 s, --san-lease-timeout)"]  # once, not every round
    assert "could not lease 2 of the hosts h1, h2 within 5 s" in str(err.value)
    assert "host h2 is leased by worker gw1 of run abc on ctl (pid 42)" in str(err.value)
    assert lab.now == pytest.approx(5)


def test_leaser_gets_the_host_once_it_is_free() -> None:
    lab = _FakeLab({"h1": {"worker": "main", "run": "x"}})
    leaser = lab.leaser(1, timeout=60)
    original = lab.sleep

    def sleep(seconds: float) -> None:
        original(seconds)
        if lab.now > 3:
            lab.busy.clear()  # the other run finished

    leaser._sleep = sleep
    assert leaser.acquire([_host("h1")]) == ["h1"]
    assert len(lab.lines) == 1 and lab.lines[0].startswith("san: waiting for host h1, leased by worker main of run x")


def test_every_host_of_a_round_starts_at_once_and_a_failure_gives_back_the_others() -> None:
    """All hosts wanted: their agents start in parallel (each start is seconds of SSH and Python on a host);
    a start that fails closes those that started and is raised; a busy host gives the round back."""
    import threading

    lab = _FakeLab({})
    both = threading.Barrier(2, timeout=10)  # passes only if the two starts overlap
    original = lab.start

    def start(host: HostConfig) -> str:
        both.wait()
        if host.name == "bad":
            raise AgentError("no such device")
        return original(host)

    lab.start = start  # type: ignore[method-assign]
    assert lab.leaser(2).acquire([_host("h1"), _host("h2")]) == ["h1", "h2"]
    lab.open.clear()
    with pytest.raises(AgentError, match="no such device"):
        lab.leaser(2).acquire([_host("h1"), _host("bad")])
    assert lab.open == set()
    lab.busy["h2"] = {"worker": "gw1", "run": "abc"}
    with pytest.raises(LeaseTimeout, match="host h2 is leased by worker gw1"):
        lab.leaser(2, timeout=0).acquire([_host("h1"), _host("h2")])
    assert lab.open == set()


def test_a_round_longer_than_the_timeout_still_says_whom_it_waited_for() -> None:
    # Agents started over SSH: one round can take longer than a short --san-lease-timeout.
    lab = _FakeLab({"h1": {"worker": "gw1", "run": "abc"}})
    original = lab.start

    def slow_start(host: HostConfig) -> str:
        lab.now += 3
        return original(host)

    lab.start = slow_start  # type: ignore[method-assign]
    with pytest.raises(LeaseTimeout, match="host h1 is leased by worker gw1 of run abc"):
        lab.leaser(1, timeout=2).acquire([_host("h1")])
    assert lab.lines == ["san: waiting for host h1, leased by worker gw1 of run abc on ? "
                         "(up to 2 s, --san-lease-timeout)"]
    with pytest.raises(LeaseTimeout):
        lab.leaser(1, timeout=0).acquire([_host("h1")])  # no timeout: nothing to wait for, nothing to say
    assert len(lab.lines) == 1


def test_describe_holder() -> None:
    assert describe_holder({}) == "an unknown holder (it did not say who it is)"
    claims = {"worker": "gw1", "run": "3f2a", "controller": "ci", "pid": 42, "since": "T"}
    assert describe_holder(claims) == "worker gw1 of run 3f2a on ci (pid 42) since T"
    kernel = {"agent_pid": 77, "uid": 1001, "user": "alice", "command": "python3 x/hil/agent/__main__.py"}
    assert describe_holder({**claims, **kernel, "agent": True, "host": "lab1"}) == (
        "worker gw1 of run 3f2a on ci (pid 42) since T, its agent pid 77 of user alice (uid 1001) for host lab1")
    assert describe_holder({**claims, **kernel, "agent": False, "lease": "L"}) == (
        "a process that is no pytest-san agent on lease L: pid 77 of user alice (uid 1001), "
        "command 'python3 x/hil/agent/__main__.py'")
    assert describe_holder({"unanswered": "why", "lease": "L"}) == "an unknown holder on lease L (why)"


# --- over a real sshd: two emulator hosts --------------------------------------------------------------


def _policy(worker: str, timeout: float = 0.0, **kwargs: Any) -> LeasePolicy:
    lines: list[str] = []
    request = LeaseRequest(worker=worker, run=f"run-of-{worker}")
    return LeasePolicy(request=request, timeout=timeout, notify=lines.append, **kwargs)


@pytest.fixture
def holder(hosts: list[HostConfig]) -> Iterator[HilBackend]:
    backend = HilBackend(hosts[:1], leases=_policy("holder", timeout=10))
    yield backend
    backend.close()


def _holder_of(remote_tmp: Path, host: str) -> dict[str, Any]:
    record = lease.read_holder(lease.lease_name(str(remote_tmp), host))
    assert record is not None, f"no one holds {host}"
    return record


def test_a_leased_host_is_refused_with_its_holder(hosts: list[HostConfig], holder: HilBackend,
                                                   remote_tmp: Path) -> None:
    record = _holder_of(remote_tmp, NAMES[0])
    assert record["worker"] == "holder" and record["host"] == NAMES[0] and record["pid"] == os.getpid()
    with pytest.raises(LeaseTimeout) as err:
        HilBackend(hosts[:1], leases=_policy("second"))
    assert f"host {NAMES[0]} is leased by worker holder of run run-of-holder on " in str(err.value)
    second = HilBackend(hosts, leases=_policy("second", count=1))  # the next free host of the two
    assert [a.host.name for a in second.agents] == [NAMES[1]]
    second.close()
    holder.close()
    third = HilBackend(hosts[:1], leases=_policy("third"))  # free the moment the holder closed
    third.close()


def test_a_killed_agent_frees_its_lease_at_once(hosts: list[HostConfig], holder: HilBackend) -> None:
    pid = holder.agents[0].client.channel.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not is_running(pid), timeout=60)
    thief = HilBackend(hosts[:1], leases=_policy("thief"))  # at once: a single try, no waiting
    try:
        # The holder's next test needs a fresh agent: it waits for the host, then names who has it.
        holder._leaser.policy = dataclasses.replace(holder._leaser.policy, timeout=1.5)
        with pytest.raises(AgentError):
            holder.agents[0].call("leaks")  # notices its agent is gone
        with pytest.raises(BackendBroken, match=f"could not be started again: san: could not lease 1 of the hosts "
                                                f"{NAMES[0]} within 1.5 s .*host {NAMES[0]} is leased by worker thief "
                                                f"of run") as first:
            holder.reset()
    finally:
        thief.close()
    # Said once: a later reset says the same at once, without waiting out the lease timeout again
    with pytest.raises(BackendBroken) as again:
        holder.reset()
    assert str(again.value) == str(first.value)
    (held,) = holder.lease_log.records
    assert held["end"] is not None
    assert _t(held["end"]) <= _t(thief.lease_log.records[0]["start"])


def _t(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


# --- pytest runs -----------------------------------------------------------------------------------------


HOLD_TESTS = '''
import os, time
from pathlib import Path

import pytest

MARKS = Path(os.environ["SAN_TEST_MARKS"])


@pytest.mark.parametrize("n", range(2))
def test_hold(san_switch, san_backend, n):
    conn = san_switch.connect()
    me = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (MARKS / f"{me}-{n}").write_text(",".join(a.host.name for a in san_backend.agents))
    deadline = time.monotonic() + 900
    while not (MARKS / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    conn.local.send(b"x")
    assert conn.remote.recv(1) == b"x"
'''


def _report(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _no_overlap(leases: list[dict[str, Any]]) -> None:
    by_host: dict[str, list[tuple[datetime, datetime]]] = {}
    for record in leases:
        for host in record["hosts"]:
            by_host.setdefault(host, []).append((_t(record["start"]), _t(record["end"])))
    for host, spans in by_host.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"leases of {host} overlap: {spans}"


def test_two_workers_run_the_suite_on_both_hosts(pytester: pytest.Pytester, hosts: list[HostConfig]) -> None:
    inv = write_inventory(pytester.path / "lab.json", hosts)
    result = pytester.runpytest_subprocess("-n", "2", "--pyargs", "pytest_san.scenarios",
                                           "--san-backend=hil", f"--san-inventory={inv}", "--san-report=r.json")
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = _report(pytester.path / "r.json")
    assert all(c["failed"] == 0 for c in report["rules"].values()) and len(report["tests"]) > 50
    leases = report["leases"]
    assert sorted(r["worker"] for r in leases) == ["gw0", "gw1"]
    assert sorted(h for r in leases for h in r["hosts"]) == sorted(NAMES)  # both hosts, one each
    assert all(r["end"] and _t(r["start"]) <= _t(r["end"]) for r in leases)
    _no_overlap(leases)
    # each worker's hosts' kernels and records reach the merged report (hil/plugin/kernel.py)
    assert report["kernel"] == {name: os.uname().release for name in sorted(NAMES)}
    assert sorted(report["kernel_resources"]) == sorted(NAMES)


def test_more_workers_than_hosts_is_a_usage_error(pytester: pytest.Pytester, hosts: list[HostConfig]) -> None:
    inv = write_inventory(pytester.path / "lab.json", hosts)
    pytester.makepyfile(test_one="def test_one(san_switch):\n    san_switch.connect()\n")
    result = pytester.runpytest_subprocess("-n", "3", "--san-backend=hil",
                                           f"--san-inventory={inv}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # said by the controller, before any worker starts
    result.stderr.fnmatch_lines(["ERROR: 3 xdist workers x 1 host(s) each need 3 hosts, the selection has 2*"])


def test_a_second_run_waits_then_gets_the_hosts(tmp_path: Path, hosts: list[HostConfig],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    inv = write_inventory(tmp_path / "lab.json", hosts)
    (tmp_path / "test_hold.py").write_text(HOLD_TESTS)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SAN_TEST_MARKS", str(marks))
    common = ["--san-backend=hil", f"--san-inventory={inv}", "test_hold.py"]
    with (tmp_path / "first.log").open("wb") as log1, (tmp_path / "second.log").open("wb") as log2:
        first = start_pytest(["-n", "2", "--san-report=first.json", *common], tmp_path, log1)
        try:
            assert wait_until(lambda: len(list(marks.glob("gw*"))) == 2, timeout=SIGN), \
                (tmp_path / "first.log").read_text()
            second = start_pytest([f"--san-lease-timeout={WAITS_FOR_THE_TEST}", "--san-report=second.json", *common],
                                  tmp_path, log2)
            try:
                assert wait_until(lambda: b"san: waiting for host" in (tmp_path / "second.log").read_bytes(),
                                  timeout=SIGN), (tmp_path / "second.log").read_text()
                assert second.poll() is None
                (marks / "release").write_text("")
                assert first.wait(SIGN) == 0, (tmp_path / "first.log").read_text()
                assert second.wait(SIGN) == 0, (tmp_path / "second.log").read_text()
            finally:
                second.kill()
        finally:
            (marks / "release").write_text("")
            first.kill()
    output = (tmp_path / "second.log").read_text()
    run1 = _report(tmp_path / "first.json")
    run2 = _report(tmp_path / "second.json")
    waited = [line for line in output.splitlines() if line.startswith("san: waiting for host")]
    assert waited and all(" leased by worker gw" in line and " of run " in line for line in waited), output
    assert {h for r in run1["leases"] for h in r["hosts"]} == set(NAMES)
    (second_lease,) = run2["leases"]
    assert second_lease["worker"] == "main" and len(second_lease["hosts"]) == 1
    _no_overlap(run1["leases"] + run2["leases"])


def test_killing_a_worker_frees_its_hosts_at_once(tmp_path: Path, hosts: list[HostConfig],
                                                   remote_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = write_inventory(tmp_path / "lab.json", hosts)
    (tmp_path / "test_hold.py").write_text(HOLD_TESTS)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SAN_TEST_MARKS", str(marks))
    with (tmp_path / "run.log").open("wb") as log:
        run = start_pytest(["-n", "2", "--san-backend=hil", f"--san-inventory={inv}", "test_hold.py"], tmp_path, log)
        try:
            assert wait_until(lambda: len(list(marks.glob("gw*"))) == 2, timeout=SIGN), \
                (tmp_path / "run.log").read_text()
            record = _holder_of(remote_tmp, NAMES[0])
            assert record["worker"] in ("gw0", "gw1")
            os.kill(record["pid"], signal.SIGKILL)  # the worker holding the first host
            # Its SSH connection closed with it, so its agent's stdin: the agent exits, the lease goes with it.
            assert wait_until(lambda: not is_running(record["agent_pid"]), timeout=60)
            backend = HilBackend(hosts[:1], leases=_policy("next"))  # at once: a single try, no waiting
            backend.close()
            (marks / "release").write_text("")
            assert run.wait(SIGN) == 1  # the killed worker's test failed, the other passed
        finally:
            (marks / "release").write_text("")
            run.kill()
    output = (tmp_path / "run.log").read_text()
    assert f"worker '{record['worker']}' crashed" in output and "1 failed, 1 passed" in output, output[-3000:]


def test_lease_timeout_fails_naming_the_holder(pytester: pytest.Pytester, hosts: list[HostConfig]) -> None:
    inv = write_inventory(pytester.path / "lab.json", hosts)
    pytester.makepyfile(test_two="def test_a(san_switch):\n    pass\n\ndef test_b(san_switch):\n    pass\n")
    both = HilBackend(hosts, leases=_policy("blocker", timeout=10))
    try:
        result = pytester.runpytest_subprocess("--san-backend=hil",
                                               f"--san-inventory={inv}", "--san-lease-timeout=2")
    finally:
        both.close()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*san: waiting for host {NAMES[0]}, leased by worker blocker of run *",
                                 f"*could not lease 1 of the hosts {NAMES[0]}, {NAMES[1]} within 2 s*"
                                 f"host {NAMES[0]} is leased by worker blocker of run*"])
    # reported once: the session stops there, instead of the second test waiting again
    assert result.stdout.str().count(f"san: waiting for host {NAMES[0]},") == 1, result.stdout.str()
    assert "test_b" not in result.stdout.str()
