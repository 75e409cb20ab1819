"""The inventory as the run host sees the lab: itself ``local://``, its peers at their lab addresses.

The user's inventory says how the user's machine reaches each host (a forwarded port of a VM, a jump host, a key
of the user's). On the run host, the host itself is ``ansible_connection: local`` (its agent a child of the
remote pytest, no SSH), and a peer is reached at its address on the lab's own network where the inventory gives
one (``san_lab_address``, port 22), else at the address the inventory gives. A key file or known-hosts file the
host does not have is left out, so the host's own SSH setup (``~/.ssh``) applies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hil.inventory import HostConfig, Inventory, InventoryError
from hil.inventory.model import DEFAULT_PORT
from hil.inventory.writer import host_vars

__all__ = ["LabView", "lab_view"]

LAB_SSH_PORT = 22  # a peer's sshd on the lab network (what `san-hil lab` guests listen on)


KEYS_DIR = ".san-keys"  # in the run's working directory (mode 0700, removed with it): what --send-keys sends


@dataclass(frozen=True)
class LabView:
    """The rewritten inventory: its text (JSON, which the YAML reader reads too), what was changed (to log) and,
    with ``send_keys``, the files that go to the run's working directory alone, never to a pushed directory (the
    peers' key files and the known_hosts that pins their keys at their addresses as the host sees them)."""

    text: str
    notes: tuple[str, ...]
    secrets: dict[str, bytes] = field(default_factory=dict)


def find_host(inventory: Inventory, name: str) -> HostConfig:
    """The host ``name`` of ``inventory``: InventoryError naming its hosts when there is none."""
    host = inventory.hosts.get(name)
    if host is None:
        known = ", ".join(inventory.hosts) or "none"
        raise InventoryError(f"{inventory.path}: no host named {name!r} (its hosts: {known})")
    return host


def lab_view(inventory: Inventory, on: str, exists_on_host: Callable[[str], bool],
             send_keys: bool = False) -> LabView:
    """``inventory`` as seen from its host ``on``; ``exists_on_host(path)``: whether the run host has that file.
    ``send_keys``: each peer's key file goes with the run (to its working directory), and a known_hosts with each
    peer's host key, as the user's known_hosts pins it, under its address as the host sees it."""
    notes: list[str] = []
    secrets: dict[str, bytes] = {}
    pinned: list[str] = []
    rewritten: dict[str, HostConfig] = {}
    for name, host in inventory.hosts.items():
        if name == on:
            rewritten[name] = dataclasses.replace(host, connection="local", host=name, port=DEFAULT_PORT,
                                                  user=None, key_file=None, known_hosts=None)
            continue
        if host.connection == "local":
            raise InventoryError(f"{inventory.path}: host {name!r} is local (ansible_connection: local), the "
                                 f"user's own machine, which {on!r} cannot reach: leave it out of the inventory")
        address, port = host.host, host.port
        lab_address = host.extra.get("san_lab_address")
        if isinstance(lab_address, str) and lab_address:
            address, port = lab_address.split("/", 1)[0], LAB_SSH_PORT
            notes.append(f"{name}: reached from {on} at its lab address {address}:{port}")
        peer = dataclasses.replace(host, host=address, port=port)
        if send_keys:
            if host.key_file is not None:
                secrets[f"{KEYS_DIR}/{name}.key"] = host.key_file.read_bytes()
                peer = dataclasses.replace(peer, key_file=Path(f"{KEYS_DIR}/{name}.key"))
            pinned += _pins(host, address, port)
            peer = dataclasses.replace(peer, known_hosts=Path(f"{KEYS_DIR}/known_hosts"))
            rewritten[name] = peer
            continue
        if host.key_file is not None and not exists_on_host(str(host.key_file)):
            peer = dataclasses.replace(peer, key_file=None)
            notes.append(f"{name}: {host.key_file} is not on {on}: its own SSH keys (~/.ssh) are used instead")
        if host.known_hosts is not None and not exists_on_host(str(host.known_hosts)):
            peer = dataclasses.replace(peer, known_hosts=None)
            notes.append(f"{name}: {host.known_hosts} is not on {on}: its own known_hosts is used instead")
        rewritten[name] = peer
    if send_keys:
        secrets[f"{KEYS_DIR}/known_hosts"] = "".join(pinned).encode()
        notes.append(f"the peers' key files and host keys go with the run, to its working directory on {on}")
    return LabView(json.dumps(_data(inventory, rewritten), indent=2) + "\n", tuple(notes), secrets)


def _pins(host: HostConfig, address: str, port: int) -> list[str]:
    """known_hosts lines for ``host`` at ``address``:``port``: the keys the user's known_hosts holds for it."""
    import paramiko  # the hil extra's, as the transport's

    from hil.transport import DEFAULT_KNOWN_HOSTS

    source = host.known_hosts or DEFAULT_KNOWN_HOSTS.expanduser()
    try:
        known = paramiko.HostKeys(str(source))
    except OSError as exc:
        raise InventoryError(f"{host.name}: cannot read {source} to pin its host key: {exc}") from None
    keys = known.lookup(host.host if host.port == 22 else f"[{host.host}]:{host.port}")
    if not keys:
        raise InventoryError(f"{host.name}: {source} holds no host key for {host.host}:{host.port}: connect to it "
                             "once from here (san-hil prepare) before sending keys")
    name = address if port == 22 else f"[{address}]:{port}"
    return [f"{name} {key.get_name()} {key.get_base64()}\n" for key in keys.values()]


def _data(inventory: Inventory, hosts: dict[str, HostConfig]) -> dict[str, object]:
    """Every group of ``inventory`` with its hosts, each host's variables written once (under its first group)."""
    written: set[str] = set()
    children: dict[str, object] = {}
    for group, members in inventory.groups.items():
        if group == "all":
            continue
        entries: dict[str, object] = {}
        for name in members:
            entries[name] = {} if name in written else host_vars(hosts[name])
            written.add(name)
        children[group] = {"hosts": entries}
    ungrouped = {name: host_vars(host) for name, host in hosts.items() if name not in written}
    return {"all": {"hosts": ungrouped, "children": children} if ungrouped else {"children": children}}
