"""The inventory ``lab up`` writes: read unchanged by :func:`hil.inventory.load_inventory`."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from hil.inventory import HostConfig
from hil.tools.lab.keys import LAB_HOST, LabKeys
from hil.tools.lab.state import LabState

__all__ = ["GROUP", "host_configs", "inventory_data", "write_inventory"]

GROUP = "san"
DEVICE = "rxe0"
GID_INDEX = 1  # the IPv4-mapped GID of the lab address (index 0 is the link-local one)


def inventory_data(state: LabState, keys: LabKeys) -> dict[str, object]:
    common: dict[str, object] = {
        "ansible_host": LAB_HOST,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(keys.client_key),
        "san_known_hosts": str(keys.known_hosts),
        "san_engine": "verbs",
        "san_device": DEVICE,
        "san_gid_index": GID_INDEX,
    }
    hosts = {
        g.name: {"ansible_port": g.ssh_port, "san_netdev": g.netdev, "san_lab_address": g.lab_address}
        for g in state.guests
    }
    return {"all": {"children": {GROUP: {"vars": common, "hosts": hosts}}}}


def write_inventory(path: Path, state: LabState, keys: LabKeys) -> None:
    header = (
        f"# Written by `san-hil lab up` for the lab in {state.state_dir}; `san-hil lab down` removes it.\n"
        "# The guests' lab addresses (san_lab_address) exist only inside the guests.\n"
    )
    text = header + yaml.safe_dump(inventory_data(state, keys), sort_keys=False, default_flow_style=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def host_configs(state: LabState, keys: LabKeys) -> list[HostConfig]:
    """The hosts as the inventory will describe them (used to reach guests before it is written)."""
    return [
        HostConfig(name=g.name, host=LAB_HOST, port=g.ssh_port, user="root", key_file=keys.client_key,
                   known_hosts=keys.known_hosts, engine="verbs", device=DEVICE, netdev=g.netdev,
                   gid_index=GID_INDEX, groups=(GROUP,), extra={"san_lab_address": g.lab_address})
        for g in state.guests
    ]
