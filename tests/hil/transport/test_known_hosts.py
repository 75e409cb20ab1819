"""known_hosts as OpenSSH reads it: a @revoked key is trusted for no host, and no line crashes the reader.

paramiko's reader took ``@revoked`` for a host name and failed on the whole file (``Error('Incorrect padding')``,
issue 28); a real sshd checks the outcome: its key, listed and revoked, is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

import paramiko
import pytest

from hil.transport import TransportError, open_transport
from hil.transport.known_hosts import load_known_hosts
from tests.support.sshd import SshServer


def _loaded(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    load_known_hosts(keys, path)
    return keys


def test_markers_and_bad_lines(tmp_path: Path, sshd: SshServer, caplog: pytest.LogCaptureFixture) -> None:
    key = sshd.host_public_key  # "ssh-ed25519 AAAA..."
    other = f"ssh-rsa {paramiko.RSAKey.generate(1024).get_base64()}"
    path = tmp_path / "known_hosts"
    path.write_text(f"# a comment\n\nlab1 {key}\n@cert-authority *.lab {key}\nnot a key\n@weird x {key}\n"
                    f"lab2,lab3 {other}\n")
    with caplog.at_level(logging.WARNING, "hil.transport.known_hosts"):
        keys = _loaded(path)
    assert sorted(keys.keys()) == ["lab1", "lab2", "lab3"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path} line 5: not a host key line (NAMES KEYTYPE BASE64-KEY): skipped",
        f"{path} line 6: unknown marker @weird: line skipped"]
    path.write_text(f"@revoked * {key}\nlab1 {key}\n")
    assert list(_loaded(path).keys()) == []  # revoked: trusted for no host, whatever line lists it


def test_a_revoked_host_key_is_refused_in_one_line(sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * {sshd.host_public_key}\n" + sshd.known_hosts.read_text())
    with pytest.raises(TransportError) as err, \
            open_transport(sshd.host_config(name="revoked", known_hosts=known), ssh_config=None):
        pass
    text = str(err.value)
    assert "Incorrect padding" not in text and "\n" not in text.strip()
    assert "host key not in" in text and str(known) in text
