"""``san-hil lab``: the parts that need no VM, and one real boot (only with SAN_LAB_TESTS=1).

The real boot takes a few minutes under TCG and two guests' worth of CPU; run it with
``SAN_LAB_TESTS=1 pytest tests/hil/lab/test_lab.py -k boot``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import paramiko
import pytest

from hil.cli.main import main
from hil.inventory import load_inventory
from hil.lab import LabError
from hil.lab.guest import (
    FAILED_MARKER,
    GUEST_INIT_SCRIPT,
    READY_MARKER,
    GuestSpec,
    console_tail,
    lab_mac,
    mgmt_mac,
    read_marker,
    vng_command,
)
from hil.lab.hub import MAX_FRAME, Hub
from hil.lab.inventory import host_configs, write_inventory
from hil.lab.kernel import Kernel, fetch_kernel, find_kernel, image_package
from hil.lab.keys import generate_keys, write_known_hosts
from hil.lab.lab import down, leftovers, pytest_command, status
from hil.lab.procs import argv_of, group_is_ours, group_members, names_dir, stop_group, temp_files
from hil.lab.state import STATE_FILE, GuestState, LabState
from tests.support.sshd import SshServer

ROOT = Path(__file__).resolve().parents[3]


def _spec(tmp_path: Path, kvm: bool = False) -> GuestSpec:
    return GuestSpec(index=2, ssh_port=40022, hub_port=40100, vmlinuz=tmp_path / "vmlinuz-6.1",
                     init_script=tmp_path / "guest-init.sh", host_key=tmp_path / "host_ed25519",
                     authorized_keys=tmp_path / "client_ed25519.pub", memory="768M", kvm=kvm, hugepages=16)


def _state(tmp_path: Path, hosts: int = 2) -> LabState:
    state = LabState(state_dir=str(tmp_path), hub_pgid=None, hub_port=40100, kernel="/k/vmlinuz",
                     kernel_release="6.12.117+deb13-amd64")
    for i in range(1, hosts + 1):
        state.guests.append(GuestState(name=f"lab{i}", index=i, ssh_port=40020 + i, lab_mac=lab_mac(i),
                                       mgmt_mac=mgmt_mac(i), lab_address=f"10.77.0.{i}",
                                       console_log=str(tmp_path / f"lab{i}-console.log"), netdev=f"enp0s{i + 2}"))
    return state


# --- command lines ---------------------------------------------------------------------------------


def test_vng_command_line(tmp_path: Path) -> None:
    argv = vng_command(_spec(tmp_path), vng="/usr/bin/vng")
    assert argv[:3] == ["/usr/bin/vng", "--run", str(tmp_path / "vmlinuz-6.1")]
    assert argv[argv.index("--memory") + 1] == "768M"
    assert argv[argv.index("--cpus") + 1] == "1"
    assert "--disable-kvm" in argv and "--force-9p" in argv
    assert "--disable-kvm" not in vng_command(_spec(tmp_path, kvm=True))
    # the in-guest script gets the guest's identity and the lab's keys
    exec_argv = shlex.split(argv[argv.index("--exec") + 1])
    assert exec_argv == ["/bin/bash", str(tmp_path / "guest-init.sh"), "--ready", READY_MARKER, "--failed",
                         FAILED_MARKER, "--mgmt-cidr", "10.0.2.15/24", "boot", "lab2", "52:54:00:5a:00:02",
                         "10.77.0.2/24", "52:54:00:5a:01:02", str(tmp_path / "host_ed25519"),
                         str(tmp_path / "client_ed25519.pub"), "16"]
    # qemu options last, in the `=` form (a value starting with '-' is an option to argparse), no spaces
    # inside a token (vng pastes them into a shell command line)
    last = argv[-1]
    assert last.startswith("--qemu-opts=-netdev ")
    tokens = last.removeprefix("--qemu-opts=").split(" ")
    assert tokens == [
        "-netdev", "user,id=mgmt,hostfwd=tcp:127.0.0.1:40022-:22",
        "-device", "virtio-net-pci,netdev=mgmt,mac=52:54:00:5a:01:02",
        "-netdev", "socket,id=lab,connect=127.0.0.1:40100",
        "-device", "virtio-net-pci,netdev=lab,mac=52:54:00:5a:00:02",
    ]


def test_macs_and_pytest_command(tmp_path: Path) -> None:
    assert lab_mac(1) == "52:54:00:5a:00:01" and lab_mac(12) == "52:54:00:5a:00:0c"
    assert mgmt_mac(3) == "52:54:00:5a:01:03"
    argv = pytest_command(tmp_path / "lab.yaml", ["-x", "-k", "rdma"])
    assert argv[1:] == ["-m", "pytest", "--pyargs", "pytest_san.scenarios", "--san-backend=hil",
                        f"--san-inventory={tmp_path / 'lab.yaml'}", "-x", "-k", "rdma"]


def test_cli_run_passes_the_rest_to_pytest(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import hil.lab.lab as lab

    seen: dict[str, object] = {}

    def fake_run(opts: lab.UpOptions, args: list[str]) -> int:
        seen.update(opts=opts, args=args)
        return 5

    monkeypatch.setattr(lab, "run", fake_run)
    status = main(["lab", "run", "--hosts", "3", "--state-dir", str(tmp_path), "--", "-x", "-k", "reg and not read"])
    assert status == 5
    assert seen["args"] == ["-x", "-k", "reg and not read"]
    opts = seen["opts"]
    assert isinstance(opts, lab.UpOptions) and opts.hosts == 3 and opts.inventory == tmp_path / "lab.yaml"
    assert main(["lab", "run", "--state-dir", str(tmp_path), "--", "--hosts", "9"]) == 5
    assert seen["args"] == ["--hosts", "9"]


def test_cli_other_commands_still_refuse_unknown_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "--inventory", "x.yaml", "--bogus"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["lab", "up", "--bogus"])


# --- keys and inventory ----------------------------------------------------------------------------


def test_keys_and_known_hosts(tmp_path: Path) -> None:
    keys = generate_keys(tmp_path)
    assert keys.client_key.stat().st_mode & 0o777 == 0o600
    assert keys.host_key.stat().st_mode & 0o777 == 0o600
    paramiko.Ed25519Key.from_private_key_file(str(keys.client_key))
    host = paramiko.Ed25519Key.from_private_key_file(str(keys.host_key))
    write_known_hosts(keys, [40021, 40022])
    lines = keys.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["[127.0.0.1]:40021", "[127.0.0.1]:40022"]
    known = paramiko.HostKeys(str(keys.known_hosts))
    entry = known.lookup("[127.0.0.1]:40022")
    assert entry is not None and entry["ssh-ed25519"] == host


def test_inventory_is_read_by_load_inventory(tmp_path: Path) -> None:
    keys = generate_keys(tmp_path)
    state = _state(tmp_path)
    path = tmp_path / "out" / "lab.yaml"
    write_inventory(path, state, keys)
    inventory = load_inventory(path)  # check_files: the key and known_hosts must exist
    hosts = inventory.select("san")
    assert [h.name for h in hosts] == ["lab1", "lab2"]
    lab2 = hosts[1]
    assert (lab2.host, lab2.port, lab2.user) == ("127.0.0.1", 40022, "root")
    assert lab2.key_file == keys.client_key and lab2.known_hosts == keys.known_hosts
    assert (lab2.engine, lab2.device, lab2.netdev, lab2.gid_index) == ("verbs", "rxe0", "enp0s4", 1)
    assert lab2.extra["san_lab_address"] == "10.77.0.2"
    assert lab2.extra["san_lab_kernel"] == "6.12.117+deb13-amd64"  # the kernel the guests boot
    assert "(kernel 6.12.117+deb13-amd64, san_lab_kernel)" in path.read_text()
    assert host_configs(state, keys) == hosts  # what up uses before the file exists is what the file says


# --- state -----------------------------------------------------------------------------------------


def test_state_round_trip(tmp_path: Path) -> None:
    state = _state(tmp_path, hosts=3)
    state.hub_pgid = 4242
    state.add_file(tmp_path / "x")
    state.add_file(tmp_path / "x")
    state.save()
    loaded = LabState.load(tmp_path)
    assert loaded == state
    assert loaded is not None and loaded.files == [str(tmp_path / "x")] and loaded.pgids == [4242]
    assert LabState.load(tmp_path / "nothing") is None
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(LabError, match="unreadable lab state"):
        LabState.load(tmp_path)
    (tmp_path / STATE_FILE).write_text('{"format": 99}')
    with pytest.raises(LabError, match="not a lab state file"):
        LabState.load(tmp_path)


def test_down_and_status_on_a_missing_lab(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "down", "--state-dir", str(tmp_path / "none")]) == 0
    assert f"no lab in {tmp_path / 'none'} (no state.json): nothing to stop" in capsys.readouterr().err  # progress
    assert main(["lab", "status", "--state-dir", str(tmp_path / "none")]) == 1
    assert "no lab in" in capsys.readouterr().out


def test_down_removes_a_dead_labs_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "lab"
    directory.mkdir()
    state = _state(directory)
    dead = subprocess.Popen(["true"], start_new_session=True)
    dead.wait()
    state.guests[0].pgid = dead.pid  # gone: nothing to stop, files still to remove
    for name in ("client_ed25519", "lab1-console.log", "guest-init.sh"):
        (directory / name).write_text("x")
        state.add_file(directory / name)
    outside = tmp_path / "lab.yaml"
    outside.write_text("all: {}\n")
    state.add_file(outside)
    state.save()
    assert status(directory) == 1
    assert "NOT READY" in capsys.readouterr().out
    assert down(directory) == 0
    assert not directory.exists() and not outside.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a lab's guests log in root, and a test sshd run by another user "
                                              "logs in only that user")
def test_lab_ssh_reaches_a_guest_with_the_labs_keys(sshd: SshServer, tmp_path: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """`san-hil lab ssh` against a real sshd standing in for guest lab1 (its port, key and host key)."""
    directory = tmp_path / "lab"
    directory.mkdir()
    state = _state(directory, hosts=1)
    state.guests[0].ssh_port = sshd.port
    state.save()
    shutil.copy(sshd.client_key, directory / "client_ed25519")
    os.chmod(directory / "client_ed25519", 0o600)
    shutil.copy(sshd.known_hosts, directory / "known_hosts")
    assert main(["lab", "ssh", "--state-dir", str(directory), "lab1", "--", "echo from-the-guest; exit 3"]) == 3
    assert "from-the-guest" in capfd.readouterr().out
    # the command may also follow the guest's name, options included; a `--` inside it is its own
    assert main(["lab", "ssh", "--state-dir", str(directory), "lab1", "echo", "-n", "a", "--", "b"]) == 0
    assert capfd.readouterr().out == "a -- b"
    assert main(["lab", "ssh", "--state-dir", str(directory), "lab7", "true"]) == 2
    assert "has no guest 'lab7' (its guests: lab1)" in capfd.readouterr().err
    assert main(["lab", "ssh", "--state-dir", str(tmp_path / "none"), "lab1"]) == 2
    assert "no lab in" in capfd.readouterr().err
    (directory / "known_hosts").write_text("")  # the host key is pinned: an unknown one is refused
    assert main(["lab", "ssh", "--state-dir", str(directory), "lab1", "--", "true"]) != 0


def test_stop_group_ends_the_whole_group() -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    deadline = time.monotonic() + 60
    while len(group_members(leader.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(leader.pid)) == 3
    assert stop_group(leader.pid, grace=5) == []
    assert leader.poll() is not None


def test_leftovers_finds_processes_naming_the_lab(tmp_path: Path) -> None:
    state = _state(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", str(tmp_path)],
                            start_new_session=True)
    try:
        cmdline, deadline = Path(f"/proc/{proc.pid}/cmdline"), time.monotonic() + 60
        while str(tmp_path).encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)  # until it has exec'd: before that it carries pytest's command line
        assert any(str(proc.pid) in line for line in leftovers(state))
    finally:
        stop_group(proc.pid)
    assert leftovers(state) == []


# --- which processes are the lab's: paths, not substrings; the group leader; temp files -------------


def _start(argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A process in a session of its own, once it has exec'd ``argv`` (before that it carries pytest's)."""
    proc = subprocess.Popen(list(argv), start_new_session=True, env=env)
    deadline = time.monotonic() + 60
    while (argv_of(proc.pid) or [])[-1:] != [argv[-1]] and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


_SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]


def _other_lab(tmp_path: Path) -> tuple[Path, Path]:
    """Two state directories, the second's path starting with the first's: ``.../lab`` and ``.../lab2``."""
    ours, theirs = tmp_path / "lab", tmp_path / "lab2"
    ours.mkdir()
    theirs.mkdir()
    return ours, theirs


def test_a_lab_with_a_longer_path_is_not_ours(tmp_path: Path) -> None:
    ours, theirs = _other_lab(tmp_path)
    hub = _start([*_SLEEP, "--port-file", str(theirs / "hub.port")])
    try:
        assert names_dir(argv_of(hub.pid) or [], theirs) and not names_dir(argv_of(hub.pid) or [], ours)
        state = _state(ours)
        state.save()
        assert down(ours) == 0  # the other lab's hub is not a leftover of ours
        assert hub.poll() is None and not ours.exists()
    finally:
        stop_group(hub.pid)


def test_down_leaves_a_reused_process_group_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ours, theirs = _other_lab(tmp_path)
    guest = _start([*_SLEEP, "--exec", shlex.join(["/bin/bash", str(theirs / "guest-init.sh"), "boot", "lab1"])])
    try:
        state = _state(ours)
        state.guests[0].pgid = guest.pid  # a stale state: the pid now leads the other lab's guest
        state.save()
        with caplog.at_level(logging.INFO, logger="hil.lab.progress"):  # the lab's progress is logged
            assert down(ours) == 0
        assert guest.poll() is None
        assert f"process group {guest.pid} no longer runs this lab's processes; left alone" in caplog.text
    finally:
        stop_group(guest.pid)


def test_the_group_leader_decides_whether_a_group_is_ours(tmp_path: Path) -> None:
    ours = tmp_path / "lab"
    ours.mkdir()
    # Someone's program leads the group (the recorded pgid, reused); a child of it names our console log.
    spawn = "import os, subprocess, sys, time; subprocess.Popen([*sys.argv[1:], os.environ['LOG']]); time.sleep(300)"
    leader = _start([sys.executable, "-c", spawn, *_SLEEP], env={**os.environ, "LOG": str(ours / "lab1-console.log")})
    try:
        deadline = time.monotonic() + 60
        while len(group_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        (child,) = [pid for pid, _ in group_members(leader.pid) if pid != leader.pid]
        while not names_dir(argv_of(child) or [], ours) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not group_is_ours(leader.pid, ours)
        state = _state(ours, hosts=1)
        state.guests[0].pgid = leader.pid
        state.save()
        with pytest.raises(LabError, match=f"processes of the lab are still running: {child} "):
            down(ours)  # the child naming the lab is reported; the foreign group is not signalled
        assert leader.poll() is None and child in [pid for pid, _ in group_members(leader.pid)]
    finally:
        stop_group(leader.pid)


def test_a_group_whose_leader_exited_is_ours_if_its_members_name_the_lab(tmp_path: Path) -> None:
    ours, theirs = _other_lab(tmp_path)
    # qemu names the lab only inside the base64 of its kernel command line's virtme.exec
    script = base64.b64encode(shlex.join(["/bin/bash", str(ours / "guest-init.sh"), "boot", "lab1"]).encode())
    qemu_like = [*_SLEEP, "-append", f"console=ttyS0 virtme.exec=`{script.decode()}` panic=-1"]
    spawn = "import subprocess, sys; subprocess.Popen(sys.argv[1:])"  # the leader exits, its child stays
    leader = subprocess.Popen([sys.executable, "-c", spawn, *qemu_like], start_new_session=True)
    leader.wait()
    deadline = time.monotonic() + 60
    while not group_members(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        ((qemu, _),) = group_members(leader.pid)
        assert group_is_ours(leader.pid, ours) and not group_is_ours(leader.pid, theirs)
        assert any(line.startswith(f"{qemu} ") for line in leftovers(_state(ours)))
        state = _state(ours, hosts=1)
        state.guests[0].pgid = leader.pid
        state.save()
        assert down(ours) == 0
        assert group_members(leader.pid) == []
    finally:
        stop_group(leader.pid)


def test_temp_files_named_or_held_open_by_the_group(tmp_path: Path) -> None:
    named, held = tmp_path / "virtme_retnamed1", tmp_path / "virtme_retheld_2"
    named.write_text("")
    held.write_text("")
    # virtme-run holds its temp file open before qemu's command line names it
    code = "import os, time; fd = os.open(os.environ['HELD'], os.O_RDONLY); time.sleep(300)"
    proc = _start([sys.executable, "-c", code], env={**os.environ, "HELD": str(held)})
    other = _start([*_SLEEP, "-chardev", f"file,id=ret,path={named}"])
    try:
        deadline = time.monotonic() + 60
        while not temp_files(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert temp_files(proc.pid) == [str(held)]
        assert temp_files(other.pid) == [str(named)]
    finally:
        stop_group(proc.pid)
        stop_group(other.pid)


def test_a_boot_stopped_before_the_ready_marker_leaves_no_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hil.lab.boot as lab

    vmlinuz = tmp_path / "vmlinuz"
    vmlinuz.write_bytes(b"k")
    kernel = Kernel(version="6.1", root=tmp_path, vmlinuz=vmlinuz, modules=tmp_path, rxe_module=tmp_path)
    monkeypatch.setattr(lab, "fetch_kernel", lambda *a, **k: kernel)
    monkeypatch.setattr(lab, "find_vng", lambda: "vng")
    temps: list[Path] = []

    def start_guest(spec: GuestSpec, console_log: Path, vng: str) -> subprocess.Popen[bytes]:
        # like vng: a temp file qemu's chardev names, removed only if vng exits normally; no ready marker
        fd, name = tempfile.mkstemp(prefix="virtme_ret")
        os.close(fd)
        temps.append(Path(name))
        console_log.write_bytes(b"booting\n")
        return _start([*_SLEEP, *vng_command(spec, vng)[1:], "-chardev", f"file,id=ret,path={name}"])

    monkeypatch.setattr(lab, "start_guest", start_guest)
    state_dir = tmp_path / "lab"
    opts = lab.UpOptions(hosts=1, state_dir=state_dir, kernel_cache=tmp_path / "cache", accel="tcg",
                         boot_timeout=1.0, proxy_module=False)
    out = io.StringIO()
    try:
        with pytest.raises(LabError, match="lab1 failed to boot twice: no ready marker within 1 s"):
            lab.up(opts, lab.Progress(out))
        assert len(temps) == 2, out.getvalue()
        assert [t for t in temps if t.exists()] == []  # both attempts' temp files are gone
        assert not state_dir.exists() and leftovers(_state(state_dir)) == []
    finally:
        for t in temps:
            t.unlink(missing_ok=True)


def test_a_second_signal_cannot_cut_the_teardown_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM during `lab up`, then another just as the teardown begins (before it holds signals off):
    the second is ignored, everything is stopped and removed, and up says it was interrupted."""
    import hil.lab.boot as lab

    vmlinuz = tmp_path / "vmlinuz"
    vmlinuz.write_bytes(b"k")
    kernel = Kernel(version="6.1", root=tmp_path, vmlinuz=vmlinuz, modules=tmp_path, rxe_module=tmp_path)
    monkeypatch.setattr(lab, "fetch_kernel", lambda *a, **k: kernel)
    monkeypatch.setattr(lab, "find_vng", lambda: "vng")
    guests: list[subprocess.Popen[bytes]] = []

    def start_guest(spec: GuestSpec, console_log: Path, vng: str) -> subprocess.Popen[bytes]:
        console_log.write_bytes(b"booting\n")
        guests.append(_start([*_SLEEP, *vng_command(spec, vng)[1:]]))
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal: `up` must stop and tear down
        return guests[-1]

    class SecondSignal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "stopping and removing what was started" in record.getMessage():
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(lab, "start_guest", start_guest)
    progress_log = logging.getLogger("hil.lab.progress")
    handler = SecondSignal()
    progress_log.addHandler(handler)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    state_dir = tmp_path / "lab"
    try:
        status = main(["lab", "up", "--hosts", "1", "--state-dir", str(state_dir), "--kernel-cache",
                       str(tmp_path / "cache"), "--accel", "tcg", "--no-proxy-module"])
    finally:
        progress_log.removeHandler(handler)
        for guest in guests:
            stop_group(guest.pid)
        if state_dir.exists():  # this test failing must not leave the hub behind
            down(state_dir)
    assert status == 130
    assert guests and all(guest.poll() is not None for guest in guests)
    assert not state_dir.exists() and leftovers(_state(state_dir)) == []
    assert {sig: signal.getsignal(sig) for sig in before} == before  # the command's handlers are gone with it


def test_only_the_first_stop_signal_stops_a_lab_command() -> None:
    from hil.lab.lab import Terminated, handle_stop_signals

    previous = handle_stop_signals()
    try:
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between two bytecodes of the main thread
                time.sleep(0.001)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # ignored now
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    handle_stop_signals()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                time.sleep(0.001)
        assert not isinstance(info.value, Terminated)  # Ctrl-C reached pytest too; SIGTERM only us
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- the guest's boot script and console -----------------------------------------------------------


def _fake_sysfs(tmp_path: Path) -> Path:
    net = tmp_path / "net"
    for name, mac in {"lo": "00:00:00:00:00:00", "enp0s2": "52:54:00:5a:01:01",
                      "enp0s3": "52:54:00:5a:00:01", "eth1": "52:54:00:12:34:56"}.items():
        (net / name).mkdir(parents=True)
        (net / name / "address").write_text(mac + "\n")
    (net / "bonding_masters").write_text("")  # a file, not a netdev: skipped
    return net


def _find_nic(script: Path, net: Path, mac: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SAN_LAB_SYSFS_NET": str(net)}
    return subprocess.run(["bash", str(script), "find-nic", mac], env=env, capture_output=True, text=True,
                          check=False)


def test_boot_script_finds_the_nic_by_mac(tmp_path: Path) -> None:
    script = GUEST_INIT_SCRIPT
    subprocess.run(["bash", "-n", str(script)], check=True)  # syntax
    net = _fake_sysfs(tmp_path)
    assert _find_nic(script, net, "52:54:00:5a:00:01").stdout == "enp0s3\n"
    assert _find_nic(script, net, "52:54:00:5A:01:01").stdout == "enp0s2\n"  # case does not matter
    missing = _find_nic(script, net, "52:54:00:5a:00:09")
    assert missing.returncode == 1 and missing.stdout == ""
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "usage" in usage.stderr


@pytest.mark.parametrize("options", [[], ["--ready", READY_MARKER, "--failed", FAILED_MARKER], ["--ready"]])
def test_boot_without_its_markers_or_address_is_a_usage_error(options: list[str]) -> None:
    """The markers and the management address are the script's arguments: booting without one of them stops at
    once with the usage, before the script touches a NIC."""
    argv = ["bash", str(GUEST_INIT_SCRIPT), *options, "boot", "lab1", "52:54:00:5a:00:01", "10.77.0.1/24",
            "52:54:00:5a:01:01", "/nonexistent/host_key", "/nonexistent/authorized_keys"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode != 0 and "usage" in done.stderr and done.stdout == ""


def test_the_ready_marker_waits_for_sshd_to_listen(tmp_path: Path) -> None:
    """sshd forks before it binds its port and writes its pid file once it listens: the script waits for
    the pid file between starting sshd and printing the marker."""
    lines = GUEST_INIT_SCRIPT.read_text().splitlines()
    started = next(i for i, line in enumerate(lines) if line.strip().startswith("/usr/sbin/sshd "))
    waited = next(i for i, line in enumerate(lines) if line.strip().startswith('wait_file "$d/sshd.pid"'))
    ready = next(i for i, line in enumerate(lines) if line.strip().startswith('echo "$READY_MARKER'))
    assert started < waited < ready
    script = GUEST_INIT_SCRIPT
    pid_file = tmp_path / "sshd.pid"
    waiter = subprocess.Popen(["bash", str(script), "wait-file", str(pid_file), "120"])
    try:
        assert waiter.poll() is None
        pid_file.write_text("42\n")
        assert waiter.wait(timeout=120) == 0
    finally:
        waiter.kill()
        waiter.wait()
    missing = subprocess.run(["bash", str(script), "wait-file", str(tmp_path / "never"), "0"], check=False)
    assert missing.returncode == 1


def test_ready_and_failed_markers(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    assert read_marker(log, "lab1") is None
    log.write_text("[    1.2] virtio_net virtio1 enp0s3: renamed\r\nsan-lab: lab1: init started\n")
    assert read_marker(log, "lab1") is None
    with log.open("a") as f:
        f.write(f"{READY_MARKER} lab2 netdev=eth9 mgmt=eth8\n")  # another guest's line: not ours
    assert read_marker(log, "lab1") is None
    with log.open("a") as f:
        f.write(f"{READY_MARKER} lab1 netdev=enp0s3 mgmt=enp0s2\r\n")
    assert read_marker(log, "lab1") == (True, "enp0s3")
    log.write_text(f"{FAILED_MARKER} lab1: modprobe rdma_rxe failed\n")
    assert read_marker(log, "lab1") == (False, "modprobe rdma_rxe failed")
    log.write_text("\n".join(f"line {i}" for i in range(100)))
    assert console_tail(log, 3) == "line 97\nline 98\nline 99"
    assert console_tail(tmp_path / "none") == "(no console log)"


# --- kernel ----------------------------------------------------------------------------------------


class _Apt:
    """Stands in for apt-cache / apt-get / dpkg-deb: argv[0] -> (exit status, output)."""

    def __init__(self, outputs: dict[str, tuple[int, str]]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        code, out = self.outputs.get(argv[0], (0, ""))
        return subprocess.CompletedProcess(list(argv), code, out, out if code else "")


def test_image_package_from_apt_cache() -> None:
    out = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n"
    assert image_package(run=_Apt({"apt-cache": (0, out)})) == "linux-image-6.1.0-57-amd64"
    with pytest.raises(LabError, match=r"apt cannot find linux-image-amd64 in the host.s apt sources: E: No packages "
                                       r"found.*apt-get update"):
        image_package(run=_Apt({"apt-cache": (100, "E: No packages found")}))
    with pytest.raises(LabError, match="names no versioned"):
        image_package(run=_Apt({"apt-cache": (0, "linux-image-amd64\n")}))


def test_kernel_cache_is_reused_and_checked(tmp_path: Path) -> None:
    tree = tmp_path / "6.1.0-57-amd64"
    (tree / "boot").mkdir(parents=True)
    (tree / "boot" / "vmlinuz-6.1.0-57-amd64").write_bytes(b"k")
    assert find_kernel(tree) is None  # no modules: not a lab kernel
    rxe = tree / "lib/modules/6.1.0-57-amd64/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"
    rxe.parent.mkdir(parents=True)
    rxe.write_bytes(b"m")
    kernel = find_kernel(tree)
    assert kernel is not None and kernel.version == "6.1.0-57-amd64" and kernel.rxe_module == rxe
    (tree / ".complete").write_text("linux-image-6.1.0-57-amd64\n")
    run = _Apt({"apt-cache": (0, "  Depends: linux-image-6.1.0-57-amd64\n")})
    assert fetch_kernel(tmp_path, progress=lambda m: None, run=run) == kernel
    assert [c[0] for c in run.calls] == ["apt-cache"]  # cached: nothing downloaded
    failing = _Apt({"apt-cache": (0, "  Depends: linux-image-6.1.0-99-amd64\n"), "apt-get": (100, "E: 404")})
    with pytest.raises(LabError, match=r"apt-get download linux-image-6.1.0-99-amd64` failed: E: 404"):
        fetch_kernel(tmp_path, progress=lambda m: None, run=failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["6.1.0-57-amd64"]  # no half-made folder left


# --- the hub ---------------------------------------------------------------------------------------


@pytest.fixture
def hub() -> Iterator[tuple[Hub, int]]:
    loop = asyncio.new_event_loop()
    relay = Hub(log=False)
    server = loop.run_until_complete(relay.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield relay, server.sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


def _frame(data: bytes) -> bytes:
    return struct.pack("!I", len(data)) + data


def _recv_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    (length,) = struct.unpack("!I", exactly(4))
    return exactly(length)


def test_hub_floods_frames_to_every_other_guest(hub: tuple[Hub, int]) -> None:
    relay, port = hub
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        deadline = time.monotonic() + 60
        while len(relay.clients) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        a, b, c = clients
        frame = bytes(range(256)) * 6  # an Ethernet-sized frame
        a.sendall(_frame(frame))
        assert _recv_frame(b) == frame and _recv_frame(c) == frame
        b.sendall(_frame(b"one") + _frame(b"two")[:5])  # the second frame split across writes
        b.sendall(_frame(b"two")[5:])
        # never echoed to its sender: an echo would have come before b's frames, which came after a's
        assert [_recv_frame(a), _recv_frame(a)] == [b"one", b"two"]
        assert [_recv_frame(c), _recv_frame(c)] == [b"one", b"two"]
        c.sendall(struct.pack("!I", MAX_FRAME + 1))  # not qemu: dropped from the segment
        assert c.recv(1) == b""
        a.sendall(_frame(b"after"))
        assert _recv_frame(b) == b"after"
        assert relay.frames == 4
    finally:
        for s in clients:
            s.close()


def test_hub_process_writes_its_port_and_stops_on_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "hub.port"
    proc = subprocess.Popen([sys.executable, "-m", "hil.lab.hub", "--port-file", str(port_file)],
                            stderr=subprocess.PIPE, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(port_file.read_text())
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert f"listening on 127.0.0.1:{port}" in err.decode()


# --- one real boot ---------------------------------------------------------------------------------


def _san_hil(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hil.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


@pytest.mark.skipif(os.environ.get("SAN_LAB_TESTS") != "1",
                    reason="boots two qemu guests for minutes: set SAN_LAB_TESTS=1 to run it")
def test_boot_two_guests_and_tear_down(tmp_path: Path) -> None:
    from hil.transport import open_transport

    state_dir = tmp_path / "lab"
    started = time.monotonic()
    result = _san_hil("lab", "up", "--hosts", "2", "--state-dir", str(state_dir), timeout=1500)
    boot_seconds = time.monotonic() - started
    print(result.stdout, result.stderr, sep="\n")
    state = LabState.load(state_dir)  # None if up failed (it tears down after itself)
    try:
        assert result.returncode == 0, result.stderr
        assert state is not None and state.ready
        hosts = load_inventory(state_dir / "lab.yaml").select("san")
        assert [h.name for h in hosts] == ["lab1", "lab2"]
        for host, peer in zip(hosts, reversed(hosts), strict=True):
            with open_transport(host, ssh_config=None) as t:
                port_state = t.run(["cat", "/sys/class/infiniband/rxe0/ports/1/state"], timeout=30)
                assert port_state.stdout.strip() == "4: ACTIVE"
                link = t.run(["cat", f"/sys/class/net/{host.netdev}/address"], timeout=30)
                assert link.stdout.strip() == lab_mac(int(host.name[3:]))
                # the segment through the hub: the peer's sshd answers on its lab address
                probe = f"import socket; print(socket.create_connection(({peer.extra['san_lab_address']!r}, 22), 10)" \
                        ".recv(4).decode())"
                banner = t.run(["/usr/bin/python3", "-c", probe], timeout=60)
                assert banner.stdout.strip() == "SSH-", banner.stderr
        assert _san_hil("lab", "status", "--state-dir", str(state_dir), timeout=60).returncode == 0
    finally:
        result = _san_hil("lab", "down", "--state-dir", str(state_dir), timeout=120)
        print(result.stdout, result.stderr, sep="\n")
    assert result.returncode == 0, result.stderr
    assert not state_dir.exists()
    assert leftovers(state) == []  # no vng, qemu or hub naming this lab's directory or ports
    print(f"lab up took {boot_seconds:.0f} s")


def test_an_interrupted_lab_command_says_what_it_left(capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C (or SIGTERM) in `lab up`/`lab run` stops the lab; in `lab ssh` the lab stays up: each says so."""
    from hil.cli import lab as cli

    def interrupted(_: object) -> int:
        raise KeyboardInterrupt

    assert cli._guarded(interrupted, "interrupted; the lab is still up")(None) == 130  # type: ignore[arg-type]
    assert capsys.readouterr().err == "san-hil lab: interrupted; the lab is still up\n"
    assert cli._guarded(interrupted)(None) == 130  # type: ignore[arg-type]
    assert capsys.readouterr().err == "san-hil lab: interrupted\n"
