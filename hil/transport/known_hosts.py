"""Reading an OpenSSH known_hosts file as OpenSSH does: markers understood, bad lines skipped, never a crash.

paramiko's own reader fails on the whole file at a ``@revoked`` line (``Error('Incorrect padding')``: it takes
the marker for a host name) and knows no markers. Here a ``@revoked`` key is never trusted (for any host,
whatever other line lists it), ``@cert-authority`` lines are skipped (paramiko checks no host certificates),
and a line that cannot be read is skipped with a warning naming the file and line, as ssh does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey
from paramiko.ssh_exception import SSHException

log = logging.getLogger(__name__)


def load_known_hosts(keys: paramiko.HostKeys, path: Path) -> None:
    """Add the trusted host keys of known_hosts file ``path`` to ``keys``. OSError when it cannot be read."""
    revoked: set[bytes] = set()
    entries: list[HostKeyEntry] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = ""
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            if marker not in ("@revoked", "@cert-authority"):
                log.warning("%s line %d: unknown marker %s: line skipped", path, number, marker)
                continue
        try:
            entry = HostKeyEntry.from_line(line, number)
        except (InvalidHostKey, SSHException, ValueError):
            entry = None
        if entry is None or entry.key is None:
            log.warning("%s line %d: not a host key line (NAMES KEYTYPE BASE64-KEY): skipped", path, number)
        elif marker == "@revoked":
            revoked.add(entry.key.asbytes())
        elif not marker:
            entries.append(entry)
    for entry in entries:
        if entry.key.asbytes() in revoked:
            continue  # a revoked key is trusted for no host
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)
