"""A real, throwaway OpenSSH server on 127.0.0.1 for the transport tests.

sshd runs under a small reaper (this file run as a script): a Linux child subreaper that adopts
whatever the test kills the parent of (a session's command once its sshd is gone), reaps it, and
on SIGTERM -- sent by ``stop()``, or by the kernel when pytest dies -- kills the whole tree. So the
tests can kill sshd processes and still leave nothing behind, zombies included.
"""

from __future__ import annotations

import ctypes
import dataclasses
import getpass
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from hil.inventory import HostConfig

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

CONFIG = """\
ListenAddress {host}:{port}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
AllowTcpForwarding yes
PrintMotd no
Subsystem sftp internal-sftp
LogLevel VERBOSE
"""


def write_keypair(path: Path, comment: str = "pytest-san-test") -> str:
    """A new ed25519 key in OpenSSH format at ``path`` (+ ``.pub``); its public line."""
    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    path.chmod(0o600)  # sshd ignores a host key others can read
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    path.with_name(path.name + ".pub").write_text(f"{public} {comment}\n")
    return public


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # the name, in parentheses, may hold spaces


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def descendants(root: int) -> list[int]:
    """Every process below ``root``, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (ppid := parent_pid(int(entry.name))) is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    queue = [root]
    while queue:
        kids = children.get(queue.pop(0), [])
        found += kids
        queue += kids
    return found


def wait_until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SshServer:
    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path  # "[127.0.0.1]:PORT ssh-ed25519 ..."
    host_public_key: str
    directory: Path
    log: Path
    process: subprocess.Popen[bytes]  # the reaper; sshd is its child

    def host_config(self, **overrides: Any) -> HostConfig:
        """An inventory host for this server, authenticated with the client key (as ``user=`` if given)."""
        base = HostConfig(
            name="sshd",
            host=self.host,
            port=self.port,
            user=self.user,
            key_file=self.client_key,
            known_hosts=self.known_hosts,
        )
        return dataclasses.replace(base, **overrides)

    def processes(self) -> list[int]:
        """sshd and everything it started (the reaper itself excluded)."""
        return descendants(self.process.pid)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                for pid in self.processes():
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.process.kill()
                self.process.wait()


def start_sshd(directory: Path, host: str = "127.0.0.1", attempts: int = 3) -> SshServer:
    """Start sshd with fresh keys in ``directory``; returns once it sends its SSH banner.

    Every user the server logs in takes the client key: sshd reads ``authorized_keys`` as the user logging
    in, so for users other than ours ``directory`` and its parents must be theirs to search (the file is
    made readable by all; the private keys never are).
    """
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    host_public = write_keypair(directory / "ssh_host_ed25519_key", "test-host-key")
    client_public = write_keypair(directory / "client_key", "test-client-key")
    (directory / "authorized_keys").write_text(client_public + "\n")
    (directory / "authorized_keys").chmod(0o644)
    config = directory / "sshd_config"
    log = directory / "sshd.log"
    for _ in range(attempts):  # another process may grab the free port before sshd binds it
        port = free_port()
        config.write_text(CONFIG.format(host=host, port=port, dir=directory))
        check = subprocess.run([SSHD, "-t", "-f", config], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd -t rejects {config}: {check.stderr.strip()}")
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, __file__, "--", str(SSHD), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        known_hosts = directory / "known_hosts"
        known_hosts.write_text(f"[{host}]:{port} {host_public}\n")
        server = SshServer(
            host, port, getpass.getuser(), directory / "client_key", known_hosts, host_public, directory, log, process
        )
        if _wait_for_banner(server, timeout=15.0):
            return server
        server.stop()
        if "Address already in use" not in log.read_text(errors="replace"):
            break
    raise RuntimeError(f"sshd did not come up on {host}:{port}; its log:\n{server.log_tail()}")


def _wait_for_banner(server: SshServer, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.process.poll() is None:
        try:
            with socket.create_connection((server.host, server.port), timeout=1.0) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


# --- the reaper: python3 tests/support/sshd.py -- /usr/sbin/sshd ... --------------------------------------


def _reaper(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans below us become our children
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # pytest gone: take everything down

    def kill_tree(signum: int, frame: object) -> None:
        for pid in descendants(os.getpid()):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_tree)
    child = os.fork()
    if child == 0:
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    status = 0
    while True:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            return status
        if pid == child:
            status = os.waitstatus_to_exitcode(wait_status)


if __name__ == "__main__":
    sys.exit(_reaper(sys.argv[sys.argv.index("--") + 1 :]))
