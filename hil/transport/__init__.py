"""How the HIL backend reaches a lab host: run commands, push the agent, talk to it over stdin/stdout.

>>> with open_transport(host) as t:                      # doctest: +SKIP
...     where = t.push({"agent.py": source})
...     agent = t.spawn([host.python_interpreter, f"{where}/agent.py"])
...     agent.write(b'{"op": "hello"}\\n')
...     reply = agent.readline(timeout=30)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hil.inventory import HostConfig
from hil.transport.base import (
    COMPLETE_MARKER,
    DEFAULT_PUSH_NAME,
    Channel,
    CommandResult,
    Transport,
    TransportError,
    content_digest,
)
from hil.transport.local import LocalChannel, LocalTransport
from hil.transport.ssh_config import DEFAULT_KNOWN_HOSTS, DEFAULT_SSH_CONFIG

if TYPE_CHECKING:
    from hil.transport.ssh import SshChannel, SshTransport

__all__ = [
    "COMPLETE_MARKER",
    "DEFAULT_KNOWN_HOSTS",
    "DEFAULT_PUSH_NAME",
    "DEFAULT_SSH_CONFIG",
    "SSH_TIMEOUTS",
    "Channel",
    "CommandResult",
    "LocalChannel",
    "LocalTransport",
    "SshChannel",
    "SshTransport",
    "Transport",
    "TransportError",
    "content_digest",
    "open_transport",
]

# paramiko is imported when SSH is used: by open_transport for an ssh host, or on asking for these.
_SSH_NAMES = frozenset({"SshChannel", "SshTransport"})


def __getattr__(name: str) -> object:
    if name in _SSH_NAMES:
        from hil.transport import ssh

        return getattr(ssh, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SSH_TIMEOUTS = frozenset({"connect_timeout", "banner_timeout", "auth_timeout", "channel_timeout", "keepalive"})


def open_transport(host: HostConfig, *, ssh_config: Path | None = DEFAULT_SSH_CONFIG, **timeouts: float) -> Transport:
    """A connected transport for ``host`` (by ``host.connection``); close it, or use it in ``with``.

    ``timeouts`` (seconds) are those of :class:`SshTransport`; a local host has no use for them.
    """
    unknown = set(timeouts) - SSH_TIMEOUTS
    if unknown:
        raise TypeError(f"open_transport: unknown timeouts {sorted(unknown)}; known: {sorted(SSH_TIMEOUTS)}")
    transport: Transport
    if host.connection == "local":
        transport = LocalTransport(host)
    else:
        from hil.transport.ssh import SshTransport

        transport = SshTransport(host, ssh_config=ssh_config, **timeouts)
    try:
        transport.connect()
    except BaseException:
        transport.close()
        raise
    return transport
