"""How the HIL backend reaches a lab host: run commands, push the agent, talk to it over stdin/stdout.

>>> with open_transport(host) as t:                      # doctest: +SKIP
...     where = t.push({"agent.py": source})
...     agent = t.spawn([host.python_interpreter, f"{where}/agent.py"])
...     agent.write(b'{"op": "hello"}\\n')
...     reply = agent.readline(timeout=30)
"""

from __future__ import annotations

from pathlib import Path

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
from hil.transport.ssh import DEFAULT_KNOWN_HOSTS, DEFAULT_SSH_CONFIG, SshChannel, SshTransport

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
        transport = SshTransport(host, ssh_config=ssh_config, **timeouts)
    try:
        transport.connect()
    except BaseException:
        transport.close()
        raise
    return transport
