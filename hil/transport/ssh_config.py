"""Where an SSH connection goes: the inventory's host joined with ``~/.ssh/config``.

Inventory values win over the config (HostName, User, Port, IdentityFile); ProxyJump entries become
the hops to connect through first, each resolved against the config in turn, as ssh does. No paramiko
here: the transport parses the config file and hands in its lookup, so the defaults below can be
imported without loading paramiko.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hil.inventory import DEFAULT_PORT, HostConfig

__all__ = ["DEFAULT_KNOWN_HOSTS", "DEFAULT_SSH_CONFIG", "Endpoint", "Lookup", "hostport", "jump_chain", "target"]

DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")  # what ssh tries when nothing names a key
_MAX_JUMPS = 8

# The options ~/.ssh/config gives a host alias, keys lower-case (paramiko.SSHConfig.lookup); ValueError
# for a host the transport cannot reach as configured.
Lookup = Callable[[str], Mapping[str, object]]


def hostport(hostname: str, port: int) -> str:
    return f"[{hostname}]:{port}" if ":" in hostname else f"{hostname}:{port}"


@dataclass(frozen=True)
class Endpoint:
    """One host to log in to: the target, or a jump host on the way."""

    alias: str  # as the inventory or the ProxyJump entry names it
    hostname: str
    port: int
    user: str
    key_files: tuple[Path, ...]
    only_key_files: bool  # the inventory named a key: offer nothing else
    default_keys: bool  # nothing named a key: also try ~/.ssh/id_*

    @property
    def at(self) -> str:
        return hostport(self.hostname, self.port)


def _text(options: Mapping[str, object], name: str) -> str | None:
    value = options.get(name)
    return None if value is None else str(value)


def _hostname(options: Mapping[str, object], alias: str) -> str:
    value = options.get("hostname")
    return alias if value is None else str(value)


def _identity_files(options: Mapping[str, object]) -> tuple[Path, ...]:
    value = options.get("identityfile")  # a list at runtime (the stubs say str)
    names = value if isinstance(value, list) else [value] if isinstance(value, str) else []
    return tuple(Path(str(n)).expanduser() for n in names)


def _config_port(options: Mapping[str, object], default: int) -> int:
    value = _text(options, "port")
    if value is None:
        return default
    if not value.isdigit():
        raise ValueError(f"Port {value!r} is not a number")
    return int(value)


def _split_jump(entry: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` -> (user, host, port)."""
    entry = entry.removeprefix("ssh://")
    user, _, hostport = entry.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif hostport.count(":") == 1:
        host, _, port_text = hostport.partition(":")
    else:
        host, port_text = hostport, ""
    if not host or (port_text and not port_text.isdigit()):
        raise ValueError(f"cannot read ProxyJump entry {entry!r}")
    return user or None, host, int(port_text) if port_text else None


def target(host: HostConfig, lookup: Lookup) -> tuple[Endpoint, str | None]:
    """The endpoint for ``host`` and the ProxyJump spec to reach it through (None: direct)."""
    options = lookup(host.host)
    # Inventory values win; its port default (22) is indistinguishable from "not set", so
    # a config Port applies then.
    port = host.port if host.port != DEFAULT_PORT else _config_port(options, DEFAULT_PORT)
    user = host.user or _text(options, "user") or getpass.getuser()
    keys: tuple[Path, ...]
    if host.key_file is not None:
        keys, only, defaults = (host.key_file,), True, False
    else:
        keys = _identity_files(options)
        only, defaults = False, not keys
    endpoint = Endpoint(host.host, _hostname(options, host.host), port, user, keys, only, defaults)
    return endpoint, _text(options, "proxyjump")


def jump_chain(host: HostConfig, spec: str | None, lookup: Lookup, depth: int = 0) -> list[Endpoint]:
    """The hops of a ProxyJump spec, in connection order (a first hop's own ProxyJump comes before it)."""
    if not spec or spec.lower() == "none":
        return []
    if depth >= _MAX_JUMPS:
        raise ValueError(f"ProxyJump nests more than {_MAX_JUMPS} deep: is there a loop?")
    hops: list[Endpoint] = []
    for i, entry in enumerate(e.strip() for e in spec.split(",")):
        user, alias, port = _split_jump(entry)
        options = lookup(alias)
        if i == 0:  # as with ssh, the first hop's own ProxyJump applies (ssh -J overrides the rest)
            hops += jump_chain(host, _text(options, "proxyjump"), lookup, depth + 1)
        keys = _identity_files(options)
        # Without an IdentityFile of its own, a lab's jump host usually takes the lab key.
        fallback = (host.key_file,) if host.key_file is not None else ()
        hops.append(
            Endpoint(
                alias=alias,
                hostname=_hostname(options, alias),
                port=port or _config_port(options, DEFAULT_PORT),
                user=user or _text(options, "user") or getpass.getuser(),
                key_files=keys or fallback,
                only_key_files=False,
                default_keys=not keys,
            )
        )
    return hops
