"""A labgrid place's ``NetworkService`` resources as the run's lab hosts.

Each ``NetworkService`` the place acquired is one host. Its resource group (``exporter/GROUP/NetworkService``)
is the host's name in the inventory, which holds what labgrid does not (the key, known hosts, engine, RDMA
device, ``san_remote_tmp``); the resource's address, port and user must agree with it. Without an inventory
entry of that name, the host is the resource itself: ``ssh://username@address:port``, verbs engine, the SSH
configuration's key. Hosts are ordered by the place's match names (``node1``, ``node2``), else by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hil.inventory import HostConfig
from hil.scheduling.coordinator import PlaceView, ResourceView

__all__ = ["PlaceError", "place_hosts"]


class PlaceError(Exception):
    """A place whose resources cannot be the run's hosts; the message names the place and the resource."""


def _port(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ValueError(value)


def place_hosts(place: PlaceView, resources: Mapping[tuple[str, str, str, str], ResourceView],
                inventory: Mapping[str, HostConfig]) -> list[HostConfig]:
    """The hosts of acquired ``place``: one per ``NetworkService`` it holds (see the module's doc)."""
    found: list[tuple[str, HostConfig]] = []
    for path, rename in place.acquired_resources:
        if path[2] != "NetworkService":
            continue
        what = f"place {place.name}: resource {'/'.join(path[:3])}"
        resource = resources.get(path)
        if resource is None:
            raise PlaceError(f"{what} is not announced by any exporter now (is its exporter running?)")
        address = resource.params.get("address")
        user = resource.params.get("username")
        try:
            port = _port(resource.params.get("port", 22))
        except ValueError:
            raise PlaceError(f"{what}: port {resource.params.get('port')!r} is no number") from None
        if not isinstance(address, str) or not address:
            raise PlaceError(f"{what} has no address")
        if "%" in address:
            raise PlaceError(f"{what}: address {address!r} needs labgrid's proxy, which pytest-san does not use")
        name = path[1]
        host = inventory.get(name)
        if host is None:
            host = HostConfig(name=name, host=address, port=port, user=user if isinstance(user, str) and user else None)
        elif (host.host, host.port) != (address, port) or (isinstance(user, str) and user and host.user
                                                             and host.user != user):
            raise PlaceError(
                f"{what} is {user}@{address}:{port}, but the inventory's host {name} is "
                f"{host.user or ''}{'@' if host.user else ''}{host.host}:{host.port}: make the exporter's "
                "NetworkService and the inventory agree (the resource group is the inventory's host name)")
        found.append((rename or name, host))
    if not found:
        raise PlaceError(f"place {place.name} holds no NetworkService resource: add-named-match "
                         "EXPORTER/HOST/NetworkService NAME for each of its hosts")
    names = [h.name for _, h in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PlaceError(f"place {place.name} holds host {duplicates[0]} twice (two exporters, one group name?)")
    return [host for _, host in sorted(found, key=lambda item: item[0])]


def hosts_text(hosts: Sequence[HostConfig]) -> str:
    return ", ".join(h.name for h in hosts)
