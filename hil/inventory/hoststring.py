"""One-off hosts given as strings instead of an inventory file (testinfra style)::

    ssh://root@127.0.0.1:10022?engine=verbs&device=rxe0&port=1&gid_index=1
    local://?engine=emulator&loopback=1

A string becomes the inventory variables it stands for, which are checked as an inventory's are.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from hil.inventory.keys import FIELD_KEYS, NO_PASSWORDS, make_host, parse_vars
from hil.inventory.model import HostConfig, Source, check_host_name

__all__ = ["parse_host_string"]

# The query parameters are HostConfig's field names (the address, port, user and connection are
# written in the URL itself); each stands for that field's inventory key.
_QUERY_FIELDS = ("engine", "device", "netdev", "gid_index", "loopback", "known_hosts", "key_file",
                 "python_interpreter")
_QUERY_KEYS = {name: FIELD_KEYS[name] for name in _QUERY_FIELDS}
_QUERY_KEYS["port"] = FIELD_KEYS["device_port"]  # the RDMA port (san_port); the SSH port is in the URL


def parse_host_string(spec: str, *, check_files: bool = True) -> HostConfig:
    """``[ssh://][user@]host[:port][?k=v&...]`` or ``local://[?k=v&...]`` -> a validated host.

    Query keys are HostConfig field names (engine, device, netdev, gid_index, loopback, known_hosts,
    key_file, python_interpreter) and ``port``, the RDMA port (san_port; the SSH port is written
    after the host); relative paths resolve against the current directory.
    """
    src = Source(f"host string {spec!r}", Path.cwd(), check_files)
    try:
        parts = urlsplit(spec if "://" in spec else f"ssh://{spec}")
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise src.error(str(exc)) from None
    if parts.scheme not in ("ssh", "local"):
        raise src.error(f"expected ssh:// or local://, got {parts.scheme!r}://")
    if parts.path not in ("", "/") or parts.fragment:
        raise src.error("unexpected path or fragment; options go after '?'")
    raw: dict[str, object] = {FIELD_KEYS["connection"]: parts.scheme}
    if parts.scheme == "local":
        if parts.netloc:
            raise src.error(f"local:// takes no host, got {parts.netloc!r}")
        name = "localhost"
    else:
        userinfo, _, hostport = parts.netloc.rpartition("@")
        if ":" in userinfo:
            raise src.error(NO_PASSWORDS)
        name, port = _split_host_port(hostport, src)
        raw[FIELD_KEYS["host"]] = name
        if userinfo:
            raw[FIELD_KEYS["user"]] = unquote(userinfo)
        if port is not None:
            raw[FIELD_KEYS["port"]] = port
    for param, value in parse_qsl(parts.query, keep_blank_values=True):
        key = _QUERY_KEYS.get(param)
        if key is None:
            raise src.error(f"unknown option {param!r}; known: {', '.join(_QUERY_KEYS)}")
        if key in raw:
            raise src.error(f"option {param!r} given twice")
        raw[key] = value
    return make_host(name, parse_vars(raw, src, f"host {name!r}"), ())


def _split_host_port(hostport: str, src: Source) -> tuple[str, str | None]:
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise src.error(f"cannot read host and port from {hostport!r}")
        port = rest[1:] if rest else None
    elif hostport.count(":") > 1:
        raise src.error(f"write an IPv6 address in brackets: [{hostport}]")
    else:
        host, colon, port_text = hostport.partition(":")
        port = port_text if colon else None
    if not host:
        raise src.error("no host name")
    check_host_name(host, src)
    return host, port
