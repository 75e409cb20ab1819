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

from hil.tools.lab import LabError
from hil.tools.lab.tools import beside_interpreter, env_with, find_tool

__all__ = [
    "FAILED_MARKER",
    "GUEST_INIT",
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


# The in-guest boot script (bash). `find-nic` is its own subcommand so the MAC matching can be tested on
# a fake sysfs tree (SAN_LAB_SYSFS_NET) without a guest.
GUEST_INIT = r"""#!/bin/bash
# pytest-san lab guest init, written by `san-hil lab up` and run by virtme-ng inside each guest (as root).
#   guest-init.sh boot NAME LAB_MAC LAB_CIDR MGMT_MAC HOST_KEY AUTHORIZED_KEYS [HUGEPAGES [rxe|siw [SIW_KO]]]
#   guest-init.sh find-nic MAC        # prints the interface that has MAC
#   guest-init.sh wait-file PATH SECONDS   # status 0 once PATH exists, 1 after SECONDS without it
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SYSFS_NET=${SAN_LAB_SYSFS_NET:-/sys/class/net}
SLIRP_GUEST=@SLIRP_GUEST@

find_nic() {
    local want dir
    want=$(printf '%s' "$1" | tr 'A-F' 'a-f')
    for dir in "$SYSFS_NET"/*; do
        [ -r "$dir/address" ] || continue
        if [ "$(cat "$dir/address" 2>/dev/null)" = "$want" ]; then
            basename "$dir"
            return 0
        fi
    done
    return 1
}

wait_nic() {  # MAC SECONDS: virtio-net may still be probing when we start
    local tries=$(( $2 * 10 ))
    while [ "$tries" -gt 0 ]; do
        find_nic "$1" && return 0
        sleep 0.1
        tries=$(( tries - 1 ))
    done
    return 1
}

wait_file() {  # PATH SECONDS: until PATH exists
    local tries=$(( $2 * 10 ))
    while [ ! -e "$1" ]; do
        [ "$tries" -gt 0 ] || return 1
        sleep 0.1
        tries=$(( tries - 1 ))
    done
}

fail() {
    echo "@FAILED@ $NAME: $*"
    ip -br link 2>&1 | sed 's/^/  /'
    exit 1  # the guest powers off; the controller shows this console and retries once
}

step() { echo "san-lab: $NAME: $*"; }

boot() {
    NAME=$1 LAB_MAC=$2 LAB_CIDR=$3 MGMT_MAC=$4 HOST_KEY=$5 AUTH_KEYS=$6 HUGEPAGES=${7:-0} PROVIDER=${8:-rxe}
    SIW_KO=${9:-}
    step "init started"
    modprobe virtio_net 2>/dev/null
    LAB=$(wait_nic "$LAB_MAC" 60) || fail "no NIC with MAC $LAB_MAC"
    MGMT=$(wait_nic "$MGMT_MAC" 60) || fail "no NIC with MAC $MGMT_MAC"
    ip link set lo up
    ip addr add "$SLIRP_GUEST" dev "$MGMT" && ip link set "$MGMT" up || fail "cannot configure $MGMT"
    ip addr add "$LAB_CIDR" dev "$LAB" && ip link set "$LAB" up || fail "cannot configure $LAB"
    step "lab NIC $LAB ($LAB_MAC) $LAB_CIDR, management NIC $MGMT ($MGMT_MAC)"
    # One provider per guest: rxe and siw on one netdev conflict (RDMA CM picks by address).
    case "$PROVIDER" in
        rxe)
            DEV=rxe0
            modprobe rdma_rxe || fail "modprobe rdma_rxe failed" ;;
        siw)
            DEV=siw0
            # siw.ko is built out of tree, so modules.dep does not know it and insmod loads nothing it
            # needs: load what the module says it depends on first (ib_core, libcrc32c).
            for dep in $(modinfo -F depends "$SIW_KO" | tr ',' ' '); do
                modprobe "$dep" || fail "modprobe $dep (for siw.ko) failed"
            done
            insmod "$SIW_KO" || fail "insmod $SIW_KO failed: $(dmesg | tail -n 3)"
            # iWARP runs over TCP: a peer that vanished (its link down) is noticed only when TCP gives up
            # retransmitting, after about 15 min with the default tcp_retries2 of 15; 5 gives up after
            # about 13 s, as RoCE's retry count does within seconds.
            echo 5 >/proc/sys/net/ipv4/tcp_retries2 || fail "cannot set net.ipv4.tcp_retries2 to 5" ;;
        *) fail "unknown provider $PROVIDER" ;;
    esac
    rdma link add "$DEV" type "$PROVIDER" netdev "$LAB" || fail "rdma link add $DEV on $LAB failed"
    step "$(rdma link show "$DEV"/1 2>&1)"
    # 2 MiB hugetlb pages: the proxy's contiguous memory and common DMA buffers (P3-P5) come from them.
    if [ "$HUGEPAGES" -gt 0 ]; then
        echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages
        step "hugetlb pages: $(cat /proc/sys/vm/nr_hugepages) of $HUGEPAGES asked for"
    fi

    # sshd with the lab's host key, root login with the lab's client key only. / is read-only and
    # /run is a fresh tmpfs: everything sshd needs goes there, with the modes it insists on.
    # UsePAM: virtme-ng-init locks every account in its /etc/shadow ("!"), and sshd without PAM
    # refuses a locked account even a public key.
    local d=/run/san-lab
    mkdir -p "$d" /run/sshd && chmod 755 /run/sshd
    install -m 600 "$HOST_KEY" "$d/host_key" && install -m 644 "$AUTH_KEYS" "$d/authorized_keys" \
        || fail "cannot copy the lab's SSH keys"
    cat >"$d/sshd_config" <<EOF
Port 22
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile $d/authorized_keys
UsePAM yes
StrictModes no
UseDNS no
PrintMotd no
PidFile $d/sshd.pid
Subsystem sftp internal-sftp
EOF
    # The agent pins registered memory. pam_limits starts sessions from PID 1's limits (virtme-ng-init:
    # 8 MiB), so raise those too; root has CAP_IPC_LOCK anyway, this is for a non-root agent.
    ulimit -l unlimited
    prlimit --pid 1 --memlock=unlimited:unlimited 2>/dev/null
    # Every SSH command runs through root's shell, and bash reads ~/.bashrc for it: the host's, made for
    # interactive use on the host (pyenv init costs seconds under TCG and warns of read-only shims).
    # Hide it in this guest only; the controller names interpreters by absolute path anyway.
    [ -f /root/.bashrc ] && mount --bind /dev/null /root/.bashrc
    rm -f /run/nologin /var/run/nologin  # "System is booting up" on every login otherwise
    rm -f "$d/sshd.pid"
    /usr/sbin/sshd -f "$d/sshd_config" -h "$d/host_key" -E "$d/sshd.log" \
        || fail "sshd did not start: $(tail -n 5 "$d/sshd.log" 2>&1)"
    # sshd forks into the background before it binds port 22, and writes its pid file once it listens:
    # the ready marker must not come before that, or the first SSH attempt meets a closed port.
    wait_file "$d/sshd.pid" 60 || fail "sshd is not listening after 60 s: $(tail -n 5 "$d/sshd.log" 2>&1)"
    echo "@READY@ $NAME netdev=$LAB mgmt=$MGMT"
    while :; do sleep 3600; done  # the guest lives as long as this script
}

case "${1:-}" in
    boot) shift; boot "$@" ;;
    find-nic) find_nic "$2" ;;
    wait-file) wait_file "$2" "$3" ;;
    *) echo "usage: $0 boot NAME LAB_MAC LAB_CIDR MGMT_MAC HOST_KEY AUTHORIZED_KEYS [HUGEPAGES [rxe|siw [SIW_KO]]]" \
            "| find-nic MAC | wait-file PATH SECONDS" >&2
       exit 2 ;;
esac
""".replace("@READY@", READY_MARKER).replace("@FAILED@", FAILED_MARKER).replace("@SLIRP_GUEST@", SLIRP_GUEST)


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
        "/bin/bash", str(spec.init_script), "boot", spec.name, lab_mac(spec.index),
        f"{lab_address(spec.index)}/{LAB_PREFIX}", mgmt_mac(spec.index), str(spec.host_key),
        str(spec.authorized_keys), str(spec.hugepages),
        # rxe, the default, is left unsaid: its command line is the one it always was
        *([] if spec.provider == "rxe" else [spec.provider, str(spec.siw_module or "")]),
    ])


def qemu_options(spec: GuestSpec) -> list[str]:
    """The two NICs. No spaces allowed: vng pastes these into a shell command line."""
    return [
        "-netdev", f"user,id=mgmt,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
        "-device", f"virtio-net-pci,netdev=mgmt,mac={mgmt_mac(spec.index)}",
        "-netdev", f"socket,id=lab,connect=127.0.0.1:{spec.hub_port}",
        "-device", f"virtio-net-pci,netdev=lab,mac={lab_mac(spec.index)}",
    ]


def vng_command(spec: GuestSpec, vng: str = "vng") -> list[str]:
    argv = [vng, "--run", str(spec.vmlinuz), "--name", spec.name, "--memory", spec.memory, "--cpus", "1",
            "--verbose",  # the kernel's console goes to the log too, for failed boots
            "--force-9p"]  # else vng first tries virtiofsd for seconds, and leaves its temp files behind
    if not spec.kvm:
        argv.append("--disable-kvm")
    argv += ["--exec", guest_exec(spec)]
    # `=` form: a value starting with '-' would be taken for an option by vng's argparse.
    argv.append("--qemu-opts=" + " ".join(qemu_options(spec)))
    return argv


def start_guest(spec: GuestSpec, console_log: Path, vng: str) -> subprocess.Popen[bytes]:
    """Start vng in its own session (its pid is the group id: vng -> sh -> qemu die together)."""
    with console_log.open("wb") as log:
        return subprocess.Popen(vng_command(spec, vng), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd="/", env=env_with(vng))


_MARKER_RE = re.compile(rf"^(?:{READY_MARKER}|{FAILED_MARKER}) \S.*$", re.MULTILINE)


def read_marker(console_log: Path, name: str) -> tuple[bool, str] | None:
    """(True, netdev) once the guest printed its ready marker, (False, reason) if it failed, else None."""
    try:
        text = console_log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in _MARKER_RE.findall(text):
        marker, who, *rest = line.split()
        if who.rstrip(":") != name:
            continue
        if marker == FAILED_MARKER:
            return False, " ".join(rest)
        fields = dict(f.split("=", 1) for f in rest if "=" in f)
        if "netdev" in fields:
            return True, fields["netdev"]
    return None


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
