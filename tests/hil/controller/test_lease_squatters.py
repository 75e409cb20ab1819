"""Leases against processes that squat their names: what the kernel says of them wins, they cannot stall an
agent, and no text of theirs reaches the user as a reason.

The squatters are real processes (as a second local user when the tests run as root, via ``runuser``) that
bind a lease's abstract socket name first and answer whatever they like: a forged record, a ``refused``
record, a byte at a time, a megabyte, nothing at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hil.agent import lease
from hil.controller.leases import describe_holder
from tests.support.users import other_users

ROOT = Path(__file__).resolve().parents[3]
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable  # any user may run it

SQUATTER = r"""
import json, socket, sys, time
name, mode = sys.argv[1], sys.argv[2]
with open(sys.argv[3]) as f:  # not on the command line, which the holder's description shows
    payload = f.read()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0" + name.encode())
if mode != "unbound":
    s.listen(0 if mode == "silent" else 16)
print("ready", flush=True)
deadline = time.monotonic() + 120  # bounded: the test kills it long before
while time.monotonic() < deadline:
    if mode in ("silent", "unbound"):
        time.sleep(0.1)
        continue
    conn, _ = s.accept()
    try:
        if mode == "answer":
            conn.sendall(payload.encode() + b"\n")
        elif mode == "flood":
            conn.sendall(b"x" * (1 << 20))
        elif mode == "trickle":  # a byte at a time, never a newline
            for _ in range(600):
                conn.sendall(b"{")
                time.sleep(0.2)
    except OSError:
        pass
    conn.close()
"""


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory every user can read, for the squatters' programs (tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="san-squat-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def name() -> str:
    return lease.lease_name("/tmp", f"squat-{uuid.uuid4().hex[:10]}")


class Squatter:
    def __init__(self, place: Path, name: str, mode: str, payload: object = "", *, as_agent: bool = False,
                 user: str | None = None) -> None:
        script = place / ("hil/agent/__main__.py" if as_agent else "squat.py")  # an agent's path, or not
        script.parent.mkdir(parents=True, exist_ok=True)
        script.parent.chmod(0o755)
        script.write_text(SQUATTER)
        script.chmod(0o644)
        said = place / f"payload-{uuid.uuid4().hex[:8]}"
        said.write_text(payload if isinstance(payload, str) else json.dumps(payload))
        said.chmod(0o644)
        argv = [PYTHON, str(script), name, mode, str(said)]
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        self.name = name
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"ready\n"
        self.pid = self.proc.pid if user is None else _child_of(self.proc.pid)

    def stop(self) -> None:
        if self.pid != self.proc.pid:  # runuser's child: SIGKILL on runuser would leave it running
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait()


def _child_of(pid: int) -> int:
    """runuser runs the program as its child: that child's pid."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if children else pid


Squat = Callable[..., Squatter]
"""squat(mode, payload="", *, as_agent=False, user=None): a squatter on the test's lease name."""


@pytest.fixture
def squat(place: Path, name: str) -> Iterator[Squat]:
    made: list[Squatter] = []

    def make(mode: str, payload: object = "", *, as_agent: bool = False, user: str | None = None) -> Squatter:
        made.append(Squatter(place, name, mode, payload, as_agent=as_agent, user=user))
        return made[-1]

    yield make
    for squatter in made:
        squatter.stop()


def _take(name: str) -> dict[str, object]:
    """Take lease ``name`` (the emulator's name of a host, as ``name`` was made): it must be busy."""
    host = name.rpartition("/")[2]
    held, record = lease.take("/tmp", host, {"worker": "gw9", "run": "mine"})
    if held is not None:
        held.release()
    assert held is None, "the squatted name was free"
    return record


FORGED = {"worker": "gw0", "run": "forged", "controller": "ci-box", "pid": 1, "user": "nobody", "uid": 65534,
          "agent_pid": 1, "since": "2026-01-01T00:00:00+00:00"}


def test_a_forged_record_from_no_agent_is_not_believed(squat: Squat) -> None:
    squatter = squat("answer", FORGED)
    record = _take_name(squatter)
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert record["uid"] == os.geteuid() and record["user"] == me and record["agent_pid"] == squatter.pid
    assert record["agent"] is False and "squat.py" in str(record["command"])
    assert "worker" not in record and "run" not in record
    text = describe_holder(record)
    assert text.startswith("a process that is no pytest-san agent on lease pytest-san-lease/")
    assert f": pid {squatter.pid} of user {me} (uid {os.geteuid()}), command '{PYTHON} " in text
    assert "forged" not in text and "ci-box" not in text


def test_an_agent_cannot_claim_to_be_another_user(squat: Squat) -> None:
    """Only the claims an agent may make are kept, each a short token: never a user, uid or pid of its own."""
    squatter = squat("answer", {**FORGED, "worker": "gw0 of run x on y (pid 1, user nobody)", "run": "r1"},
                     as_agent=True)
    record = _take_name(squatter)
    assert record["agent"] is True and record["uid"] == os.geteuid() and record["agent_pid"] == squatter.pid
    assert record["run"] == "r1" and record["pid"] == 1 and "worker" not in record  # not a token: dropped
    text = describe_holder(record)
    assert text.startswith("worker ? of run r1 on ci-box (pid 1) since 2026-01-01T00:00:00+00:00, its agent pid ")
    assert f"of user {pwd.getpwuid(os.geteuid()).pw_name} (uid {os.geteuid()})" in text
    assert "nobody" not in text and "65534" not in text


def test_a_refused_record_is_not_shown_as_the_reason(squat: Squat) -> None:
    squatter = squat("answer", {"refused": "the lab is closed: call 555-0100"}, as_agent=True)
    record = _take_name(squatter)
    assert "refused" not in record  # a holder's answer is never this agent's refusal: the host is busy
    text = describe_holder(record)
    assert "555" not in text and f"its agent pid {squatter.pid}" in text


def test_a_holder_that_trickles_bytes_costs_two_seconds_and_says_so(squat: Squat) -> None:
    squatter = squat("trickle")
    start = time.monotonic()
    record = _take_name(squatter)
    assert time.monotonic() - start < 30  # the deadline is 2 s; the bound only keeps a loaded machine green
    assert record["unanswered"] == "it did not say who it is within 2 s"
    text = describe_holder(record)
    assert "on lease pytest-san-lease/" in text and f"pid {squatter.pid}" in text and "within 2 s" in text


def test_a_holder_that_floods_is_cut_off(squat: Squat) -> None:
    record = _take_name(squat("flood", as_agent=True))
    assert record["unanswered"] == "its answer is longer than 4096 bytes" and "worker" not in record


def test_a_holder_that_never_accepts_is_still_named_by_the_kernel(squat: Squat) -> None:
    squatter = squat("silent")
    record = _take_name(squatter)  # its queue holds this connection: the kernel names the listener
    assert record["agent_pid"] == squatter.pid and record["uid"] == os.geteuid()
    assert record["unanswered"] == "it did not say who it is within 2 s"
    for _ in range(5):  # a full queue: no connection at all, and still no wait beyond the deadline
        record = _take_name(squatter)
    # found by its socket's inode (/proc/net/unix) among the processes this user may see (root: all)
    assert record["agent_pid"] == squatter.pid and str(record["unanswered"]).startswith("it accepts no connection")
    assert f"pid {squatter.pid} of user " in describe_holder(record)


def test_a_name_bound_but_never_listened_on_is_busy_saying_so(squat: Squat) -> None:
    squatter = squat("unbound")
    record = _take_name(squatter)
    assert record["unanswered"] == "it bound the name but does not listen on it" and "refused" not in record
    assert record["agent_pid"] == squatter.pid
    assert describe_holder(record).startswith("a process that is no pytest-san agent on lease pytest-san-lease/")


def test_a_silent_squatter_of_another_user_is_named_to_root(squat: Squat) -> None:
    """Its socket found among every process's descriptors: root may read them all (another user could not,
    and is told to ask root, `ss -xlp`)."""
    other = other_users()[0]
    squatter = squat("silent", user=other.pw_name)
    for _ in range(3):
        record = _take_name(squatter)
    assert record["agent_pid"] == squatter.pid and record["uid"] == other.pw_uid


def _take_name(squatter: Squatter) -> dict[str, object]:
    return _take(squatter.name)


def test_a_squatter_of_another_user_is_shown_as_that_user(squat: Squat) -> None:
    other = other_users()[0]
    squatter = squat("answer", FORGED, user=other.pw_name)
    record = _take_name(squatter)
    assert record["uid"] == other.pw_uid and record["user"] == other.pw_name
    assert record["agent_pid"] == squatter.pid and "squat.py" in str(record["command"])
    assert f"of user {other.pw_name} (uid {other.pw_uid})" in describe_holder(record)


# --- keyed on what is held, not on the inventory's name ------------------------------------------------


def test_two_names_for_one_device_exclude_each_other(tmp_path: Path) -> None:
    device = f"dev-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from hil.agent import lease
        held, _ = lease.take({str(tmp_path / "a")!r}, "labA", {{"worker": "gw0", "run": "first"}}, "verbs",
                             {device!r}, 1)
        print("held" if held else "busy", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        # Another inventory, another name for the machine, another san_remote_tmp: the same device and port
        busy, record = lease.take(str(tmp_path / "b"), "labB", {}, "verbs", device, 1)
        assert busy is None and record["agent_pid"] == holder.pid
        assert record["lease"] == f"pytest-san-lease/verbs/{device}/1"
        for other_device, other_port in ((device + "x", 1), (device, 2)):  # another device, another port
            other, _ = lease.take(str(tmp_path / "b"), "labA", {}, "verbs", other_device, other_port)
            assert other is not None
            other.release()
    finally:
        holder.kill()
        holder.wait()
    free, _ = lease.take(str(tmp_path / "b"), "labB", {}, "verbs", device, 1)  # a dead holder frees it
    assert free is not None
    free.release()


def test_a_verbs_agent_leases_the_port_it_would_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    """san_device and san_port unset: the device and port the engine picks, so that an inventory that names
    them and one that leaves them to the engine still meet on one lease."""
    from hil.agent.engines.verbs import devices

    picked: list[tuple[object, object]] = []

    def select(name: str | None, port: int | None = None) -> tuple[str, int]:
        picked.append((name, port))
        return (name or "mlx5_1", port or 1)

    monkeypatch.setattr(devices, "select_device", select)
    assert lease.verbs_port("rxe7", 2) == ("rxe7", 2) and picked == []  # both given: nothing to pick
    assert lease.verbs_port(None, None) == ("mlx5_1", 1)
    assert lease.verbs_port("rxe0", None) == ("rxe0", 1) and picked[-1] == ("rxe0", None)

    def none(name: object, port: object = None) -> tuple[str, int]:
        raise devices.NoRdmaDevice("no RDMA device: /sys/class/infiniband is absent")

    monkeypatch.setattr(devices, "select_device", none)
    assert lease.verbs_port(None, None) == (None, None)
    assert lease.lease_name("/tmp", "lab1", "verbs", None, None) == "pytest-san-lease/verbs/_/?"


def test_an_agent_for_another_name_of_a_leased_port_says_busy() -> None:
    """The agent itself (hil/agent/__main__.py), as the controller starts it: its hello names the holder."""
    from hil.agent import server
    from hil.rpc import framing

    device = f"dev-{uuid.uuid4().hex[:8]}"
    held, _ = lease.take("/tmp", "labA", {"worker": "gw0"}, "verbs", device, 1)
    assert held is not None
    try:
        content = framing.tree_hash(server.agent_files(ROOT))
        done = subprocess.run([sys.executable, str(ROOT / "hil/agent/__main__.py"), "--engine", "verbs", "--host",
                               "labB", "--hash", content, "--options", json.dumps({"device": device, "port": 1})],
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    finally:
        held.release()
    assert done.returncode == 4, done.stderr  # BUSY
    hello = json.loads(done.stdout.splitlines()[0])["hello"]["busy"]
    assert hello["agent_pid"] == os.getpid() and hello["lease"] == f"pytest-san-lease/verbs/{device}/1"
