"""SSH keys made for one lab: a client key, an sshd host key, and the known_hosts that pins it.

Fresh keys per lab, never the user's own: the guests run as root with the lab's public key authorized,
and the controller checks the host key strictly (hil.transport refuses unknown keys), so known_hosts
must name every forwarded port before the first connection.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["LabKeys", "generate_keys", "known_hosts_lines", "write_known_hosts"]

LAB_HOST = "127.0.0.1"


@dataclass(frozen=True)
class LabKeys:
    client_key: Path  # private, OpenSSH format, mode 0600: ansible_ssh_private_key_file
    client_pub: Path  # authorized for root in every guest
    host_key: Path  # every guest's sshd host key
    host_pub: Path
    known_hosts: Path  # san_known_hosts

    def files(self) -> list[Path]:
        return [self.client_key, self.client_pub, self.host_key, self.host_pub, self.known_hosts]

    @classmethod
    def in_dir(cls, directory: Path) -> LabKeys:
        """Where a lab in ``directory`` keeps its keys."""
        return cls(client_key=directory / "client_ed25519", client_pub=directory / "client_ed25519.pub",
                   host_key=directory / "host_ed25519", host_pub=directory / "host_ed25519.pub",
                   known_hosts=directory / "known_hosts")


def _write(path: Path, data: bytes, mode: int) -> None:
    # Created with its final mode: a private key is never readable by others, not even for a moment.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _keypair(private: Path, public: Path, comment: str) -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(private, pem, 0o600)
    _write(public, pub + f" {comment}\n".encode(), 0o644)


def generate_keys(directory: Path) -> LabKeys:
    """New client and host key pairs in ``directory``; known_hosts stays empty until the ports are known."""
    keys = LabKeys.in_dir(directory)
    _keypair(keys.client_key, keys.client_pub, "pytest-san-lab-client")
    _keypair(keys.host_key, keys.host_pub, "pytest-san-lab-host")
    _write(keys.known_hosts, b"", 0o644)
    return keys


def known_hosts_lines(host_pub: str, ports: Iterable[int]) -> list[str]:
    """``[127.0.0.1]:PORT ssh-ed25519 AAAA...``: one line per forwarded port (comment dropped)."""
    kind, blob = host_pub.split()[:2]
    return [f"[{LAB_HOST}]:{port} {kind} {blob}" for port in ports]


def write_known_hosts(keys: LabKeys, ports: Iterable[int]) -> None:
    lines = known_hosts_lines(keys.host_pub.read_text(), ports)
    tmp = keys.known_hosts.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, keys.known_hosts)  # a reader never sees a half-written file
