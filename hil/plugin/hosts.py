"""Which lab hosts a session drives: ``--san-hosts``, ``--san-inventory`` and their fallbacks, read once.

``--san-hosts`` holds comma-separated entries. An entry with a scheme is a host URL (testinfra style,
:func:`~hil.inventory.parse_host_string`): ``ssh://root@lab1:22?device=rxe0&port=1&gid_index=1`` or
``local://?engine=emulator&loopback=1``; it needs no inventory. A plain name selects that host of the
inventory's group (``--san-group``), as without URLs. Every problem is one :class:`pytest.UsageError`,
raised at session start (``hooks.pytest_sessionstart``), not once per test.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from hil.extras import missing_extra
from hil.inventory import HostConfig, InventoryError, load_inventory, parse_host_string

__all__ = ["HOSTS_KEY", "apply_overrides", "inventory_path", "select_hosts"]

HOSTS_KEY = pytest.StashKey[list[HostConfig]]()
"""The session's selected hosts, once :func:`select_hosts` has read them."""

_URL_FORMS = "ssh://[user@]host[:port][?device=...&port=...&gid_index=...] or local://[?engine=emulator&loopback=1]"


def inventory_path(config: pytest.Config) -> Path | None:
    """``--san-inventory``, else ``$SAN_INVENTORY``, else the ``san_inventory`` ini key (relative to the rootdir)."""
    given = config.getoption("san_inventory") or os.environ.get("SAN_INVENTORY")
    if given:
        return Path(given)
    ini = config.getini("san_inventory")
    if not ini:
        return None
    path = Path(str(ini)).expanduser()
    return path if path.is_absolute() else config.rootpath / path


def select_hosts(config: pytest.Config) -> list[HostConfig]:
    """The hosts ``--san-hosts`` / the inventory select; a :class:`pytest.UsageError` names any problem."""
    if HOSTS_KEY in config.stash:
        return config.stash[HOSTS_KEY]
    given = config.getoption("san_hosts")
    entries = [e.strip() for e in given.split(",")] if given else []
    if any(not e for e in entries):
        raise pytest.UsageError(f"--san-hosts {given!r}: an empty entry; separate hosts with one comma")
    urls = [e for e in entries if "://" in e]
    names = [e for e in entries if "://" not in e]
    hosts: list[HostConfig] = []
    path = inventory_path(config)
    if names or not urls:
        if path is None:
            if names:
                raise pytest.UsageError(
                    f"--san-hosts {names[0]!r}: a host name needs an inventory (--san-inventory, SAN_INVENTORY "
                    f"or the san_inventory ini key); without one give host URLs: {_URL_FORMS}")
            raise pytest.UsageError("--san-backend=hil needs lab hosts: --san-inventory PATH (or SAN_INVENTORY, "
                                    f"or the san_inventory ini key), or --san-hosts with host URLs: {_URL_FORMS}")
        group = config.getoption("san_group") or config.getini("san_group") or "san"
        try:
            hosts = load_inventory(path).select(group, names or None)
        except InventoryError as exc:
            raise pytest.UsageError(str(exc)) from None
        except ImportError as exc:  # PyYAML
            raise pytest.UsageError(f"--san-inventory: {missing_extra(exc) or exc}") from None
    for url in urls:
        try:
            hosts.append(parse_host_string(url))
        except InventoryError as exc:
            raise pytest.UsageError(f"--san-hosts: {exc}") from None
    hosts = [_override(config, host) for host in hosts]
    seen: set[str] = set()
    for host in hosts:
        if host.name in seen:
            raise pytest.UsageError(f"--san-hosts: host {host.name!r} given twice; each host once")
        seen.add(host.name)
    if any(host.connection == "ssh" for host in hosts):
        try:
            import paramiko  # noqa: F401  (imported by the SSH transport only when it connects)
        except ImportError as exc:
            raise pytest.UsageError(f"--san-backend=hil with SSH hosts: {missing_extra(exc) or exc}") from None
    config.stash[HOSTS_KEY] = hosts
    return hosts


# --san-device / --san-port / --san-gid-index -> HostConfig field, and the check the inventory key gets
_OVERRIDES = {"san_device": "device", "san_port": "device_port", "san_gid_index": "gid_index"}
_RANGES = {"san_port": (1, 255), "san_gid_index": (0, None)}


def apply_overrides(config: pytest.Config, host: HostConfig) -> HostConfig:
    """``host`` with the command line's ``--san-device``, ``--san-port`` and ``--san-gid-index``."""
    return _override(config, host)


def _override(config: pytest.Config, host: HostConfig) -> HostConfig:
    """``host`` with the command line's device, port and GID index, which apply to every selected host."""
    changes: dict[str, Any] = {}
    for option, field in _OVERRIDES.items():
        value = config.getoption(option)
        if value is None:
            continue
        low, high = _RANGES.get(option, (None, None))
        if isinstance(value, int) and ((low is not None and value < low) or (high is not None and value > high)):
            wanted = f"{low}-{high}" if high is not None else f">= {low}"
            raise pytest.UsageError(f"--{option.replace('_', '-')} {value}: expected an integer {wanted}")
        if isinstance(value, str) and not value.strip():
            raise pytest.UsageError(f"--{option.replace('_', '-')}: expected a device name")
        changes[field] = value
    # The changes are HostConfig's own fields, each checked above (mypy cannot type a **dict of several types).
    return dataclasses.replace(host, **changes) if changes else host
