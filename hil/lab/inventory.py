"""The inventory ``lab up`` writes: read unchanged by :func:`hil.inventory.load_inventory`."""

from __future__ import annotations

from pathlib import Path

import hil.inventory
from hil.inventory import HostConfig
from hil.lab.keys import LAB_HOST, LabKeys
from hil.lab.provider import provider
from hil.lab.state import LabState

__all__ = ["GROUP", "host_configs", "inventory_data", "write_inventory"]

GROUP = "san"
# What every guest has alike, written once in the group's vars; the rest is under each guest.
SHARED = ("host", "user", "key_file", "known_hosts", "engine", "device", "gid_index")


def host_configs(state: LabState, keys: LabKeys) -> list[HostConfig]:
    """The hosts as the inventory describes them (used to reach guests before it is written)."""
    rdma = provider(state.provider)
    return [
        HostConfig(name=g.name, host=LAB_HOST, port=g.ssh_port, user="root", key_file=keys.client_key,
                   known_hosts=keys.known_hosts, engine="verbs", device=rdma.device, netdev=g.netdev,
                   gid_index=rdma.gid_index, groups=(GROUP,),
                   extra={"san_lab_address": g.lab_address, "san_console_log": g.console_log,
                          **({"san_lab_kernel": state.kernel_release} if state.kernel_release else {})})
        for g in state.guests
    ]


def inventory_data(state: LabState, keys: LabKeys) -> dict[str, object]:
    return hil.inventory.inventory_data(host_configs(state, keys), group=GROUP, shared=SHARED)


def write_inventory(path: Path, state: LabState, keys: LabKeys) -> None:
    # The provider goes into the comment only: hil/inventory/keys.py has no key for it (yet).
    comment = (
        f"Written by `san-hil lab up --provider {state.provider}` for the lab in {state.state_dir} (kernel "
        f"{state.kernel_release or '?'}, san_lab_kernel); "
        "`san-hil lab down` removes it.\n"
        f"Every guest's {provider(state.provider).device} is on its lab NIC; the guests' lab addresses "
        "(san_lab_address) exist only inside the guests."
    )
    hil.inventory.write_inventory(path, host_configs(state, keys), group=GROUP, shared=SHARED, comment=comment)
