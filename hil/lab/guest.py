"""One lab guest: its addresses, its vng command line, the script it runs at boot, its console log.

Each guest has two NICs, both found inside the guest by MAC (the kernel may call them eth1 or enp0s3):
the *lab* NIC on the shared segment (the hub), which carries rxe0 (or siw0: one provider per lab), and a
*management* NIC on qemu's user-mode network whose port 22 is forwarded to a 127.0.0.1 port on the host.
The boot script is run by virtme-ng (``--exec``); it prints a ready marker to the console once sshd runs,
and the controller waits for that marker before it opens a single SSH connection (LAB.md: connecting too
early can leave a guest's sshd without a banner for minutes).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hil.lab import LabError
from hil.lab.layout import KERNEL_ARGS, qemu_machine
from hil.lab.tools import beside_interpreter, env_with, find_tool

__all__ = [
    "FAILED_MARKER",
    "GUEST_INIT_SCRIPT",
    "LAB_PREFIX",
    "READY_MARKER",
    "GuestSpec",
    "console_tail",
    "find_vng",
    "lab_address",
    "lab_mac",
    "mgmt_mac",
    "probe_kvm",
    "read_marker",
    "ready_fields",
    "vng_command",
]

READY_MARKER = "SAN-LAB-READY"
FAILED_MARKER = "SAN-LAB-FAILED"
LAB_PREFIX = 24
MAX_GUESTS = 254
SLIRP_GUEST = "10.0.2.15/24"  # qemu user networking's guest address: hostfwd targets it by default


def lab_mac(index: int) -> str:
    """The lab NIC of guest ``index`` (1-based): 52:54:00:5a:00:0N."""
    return f"52:54:00:5a:00:{index:02x}"


def mgmt_mac(index: int) -> str:
    """The management (SSH) NIC of guest ``index``."""
    return f"52:54:00:5a:01:{index:02x}"


def lab_address(index: int) -> str:
    """The guest's address on the lab segment; it exists only inside the guests."""
    return f"10.77.0.{index}"


# The in-guest boot script (bash), shipped beside this module as install.sh is. `find-nic` is its own
# subcommand so the MAC matching can be tested on a fake sysfs tree (SAN_LAB_SYSFS_NET) without a guest.
GUEST_INIT_SCRIPT = Path(__file__).with_name("guest-init.sh")


@dataclass(frozen=True)
class GuestSpec:
    """Everything needed to boot guest ``index``."""

    index: int
    ssh_port: int
    hub_port: int
    vmlinuz: Path
    init_script: Path
    host_key: Path
    authorized_keys: Path
    memory: str = "1G"
    kvm: bool = False
    hugepages: int = 0  # 2 MiB hugetlb pages reserved at boot
    provider: str = "rxe"  # the RDMA device on the lab NIC: rxe0, or siw0 (then siw_module is loaded)
    siw_module: Path | None = None
    proxy_module: Path | None = None  # san_proxy.ko, loaded before the ready marker; None: the stand-in
    low_memory: str | None = None  # RAM below 4 GiB (qemu's size, "256M"), the rest above; None: qemu's layout

    @property
    def name(self) -> str:
        return f"lab{self.index}"


def find_vng() -> str:
    """virtme-ng's ``vng``: on PATH, else beside the running interpreter (``.venv/bin/san-hil`` run by path)."""
    vng = find_tool("vng")
    if vng is None:
        raise LabError(f"vng not found on PATH nor in {', '.join(beside_interpreter())}: pip install virtme-ng "
                       "(the project's `lab` extra) into this Python's environment")
    return vng


def guest_exec(spec: GuestSpec) -> str:
    """The command virtme-ng runs in the guest (its base64 travels on the kernel command line)."""
    return shlex.join([
        "/bin/bash", str(spec.init_script), "--ready", READY_MARKER, "--failed", FAILED_MARKER,
        "--mgmt-cidr", SLIRP_GUEST, *(["--proxy-ko", str(spec.proxy_module)] if spec.proxy_module else []),
        "boot", spec.name, lab_mac(spec.index),
        f"{lab_address(spec.index)}/{LAB_PREFIX}", mgmt_mac(spec.index), str(spec.host_key),
        str(spec.authorized_keys), str(spec.hugepages),
        # rxe, the default, is left unsaid: its command line is the one it always was
        *([] if spec.provider == "rxe" else [spec.provider, str(spec.siw_module or "")]),
    ])


def qemu_options(spec: GuestSpec) -> list[str]:
    """The two NICs, and the memory layout. No spaces allowed: vng pastes these into a shell command line."""
    return [
        "-netdev", f"user,id=mgmt,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
        "-device", f"virtio-net-pci,netdev=mgmt,mac={mgmt_mac(spec.index)}",
        "-netdev", f"socket,id=lab,connect=127.0.0.1:{spec.hub_port}",
        "-device", f"virtio-net-pci,netdev=lab,mac={lab_mac(spec.index)}",
        *(qemu_machine(spec.low_memory) if spec.low_memory else []),
    ]


def vng_command(spec: GuestSpec, vng: str = "vng") -> list[str]:
    argv = [vng, "--run", str(spec.vmlinuz), "--name", spec.name, "--memory", spec.memory, "--cpus", "1",
            "--verbose",  # the kernel's console goes to the log too, for failed boots
            "--force-9p"]  # else vng first tries virtiofsd for seconds, and leaves its temp files behind
    if not spec.kvm:
        argv.append("--disable-kvm")
    argv += ["--exec", guest_exec(spec)]
    if spec.low_memory:
        argv += [f"--append={arg}" for arg in KERNEL_ARGS]
    # `=` form: a value starting with '-' would be taken for an option by vng's argparse.
    argv.append("--qemu-opts=" + " ".join(qemu_options(spec)))
    return argv


def start_guest(spec: GuestSpec, console_log: Path, vng: str) -> subprocess.Popen[bytes]:
    """Start vng in its own session (its pid is the group id: vng -> sh -> qemu die together)."""
    with console_log.open("wb") as log:
        return subprocess.Popen(vng_command(spec, vng), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd="/", env=env_with(vng))


_MARKER_RE = re.compile(rf"^(?:{READY_MARKER}|{FAILED_MARKER}) \S.*$", re.MULTILINE)


def _marker(console_log: Path, name: str) -> tuple[bool, str, dict[str, str]] | None:
    try:
        text = console_log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in _MARKER_RE.findall(text):
        marker, who, *rest = line.split()
        if who.rstrip(":") != name:
            continue
        if marker == FAILED_MARKER:
            return False, " ".join(rest), {}
        fields = dict(f.split("=", 1) for f in rest if "=" in f)
        if "netdev" in fields:
            return True, fields["netdev"], fields
    return None


def read_marker(console_log: Path, name: str) -> tuple[bool, str] | None:
    """(True, netdev) once the guest printed its ready marker, (False, reason) if it failed, else None."""
    found = _marker(console_log, name)
    return None if found is None else found[:2]


def ready_fields(console_log: Path, name: str) -> dict[str, str]:
    """The ready marker's ``key=value`` fields (``netdev``, ``mgmt``, ``proxy``); empty before it."""
    found = _marker(console_log, name)
    return found[2] if found is not None else {}


def console_tail(console_log: Path, lines: int = 40) -> str:
    try:
        text = console_log.read_text(errors="replace")
    except FileNotFoundError:
        return "(no console log)"
    kept = [line.rstrip() for line in text.replace("\r", "").splitlines() if line.strip()][-lines:]
    return "\n".join(kept) or "(console log is empty)"


def probe_kvm(vmlinuz: Path, timeout: float = 10.0, qemu: str = "qemu-system-x86_64") -> tuple[bool, str]:
    """Whether a KVM guest really runs here: boot the kernel with no root until it panics, on a timer.

    /dev/kvm can exist and open while KVM guests hang (nested virtualization), so only a guest that
    prints its banner and stops within ``timeout`` s counts. The panic (no root) ends qemu at once.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm is missing or not accessible"
    if shutil.which(qemu) is None:
        raise LabError(f"{qemu} not found: apt-get install qemu-system-x86")
    argv = [qemu, "-accel", "kvm", "-cpu", "host", "-m", "256", "-smp", "1", "-nodefaults", "-no-reboot",
            "-display", "none", "-serial", "stdio", "-kernel", str(vmlinuz),
            "-append", "console=ttyS0 panic=-1 loglevel=4"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"a KVM guest did not reach a kernel panic within {timeout:g} s (hangs here)"
    finally:
        if proc.poll() is None:  # timed out, or Ctrl-C: a hung KVM guest must not outlive the probe
            proc.kill()
            proc.communicate()
    text = out.decode(errors="replace")
    if "Linux version" in text or "Kernel panic" in text:
        return True, "a KVM guest booted to its expected panic"
    last = text.strip().splitlines()[-1:] or ["no output"]
    return False, f"qemu -accel kvm exited {proc.returncode}: {last[0][:200]}"
