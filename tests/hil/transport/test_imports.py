"""paramiko is loaded when SSH is used, not by importing the transports or by a local host."""

from __future__ import annotations

import subprocess
import sys


def test_paramiko_is_imported_only_when_ssh_is_used() -> None:
    code = """
import sys
import hil.transport
from hil.inventory import HostConfig
with hil.transport.open_transport(HostConfig(name="here", host="localhost", connection="local")) as t:
    assert t.run(["true"], timeout=10).returncode == 0
assert not [m for m in sys.modules if m.split(".")[0] in ("paramiko", "yaml")], "imported too early"
assert "hil.transport.ssh" not in sys.modules
from hil.transport import SshChannel, SshTransport
import hil.transport.ssh
assert (SshTransport, SshChannel) == (hil.transport.ssh.SshTransport, hil.transport.ssh.SshChannel)
assert "paramiko" in sys.modules
try:
    hil.transport.NoSuchName
except AttributeError as exc:
    assert "no attribute 'NoSuchName'" in str(exc)
else:
    raise AssertionError("NoSuchName")
"""
    subprocess.run([sys.executable, "-c", code], check=True)
