"""Writing hosts as an inventory that :func:`~hil.inventory.reader.load_inventory` reads back unchanged.

Used by ``san-hil lab up`` for its guests and by the tests for their sshd hosts. The keys come from the
one table in :mod:`hil.inventory.keys`. PyYAML is imported by :func:`write_inventory`, when it writes YAML.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from dataclasses import fields
from pathlib import Path

from hil.inventory.keys import FIELD_KEYS, KEYS
from hil.inventory.model import HostConfig

__all__ = ["inventory_data", "write_inventory"]

_DEFAULTS = {f.name: f.default for f in fields(HostConfig)}
# Written even at its default: whether a host drives a real NIC (verbs) is worth reading in the file.
_ALWAYS_WRITTEN = frozenset({"engine"})


def _value(host: HostConfig, name: str) -> object:
    value = getattr(host, name)
    return str(value) if isinstance(value, Path) else value


def _written(name: str, value: object) -> bool:
    return value is not None and (value != _DEFAULTS[name] or name in _ALWAYS_WRITTEN)


def host_vars(host: HostConfig, skip: Collection[str] = ()) -> dict[str, object]:
    """The variables that describe ``host``, in table order, then its ``extra`` ones; fields in ``skip``
    are left out. A field at its default is left out (``san_engine`` is always written), and so is
    ``ansible_host`` when it is the host's name."""
    out: dict[str, object] = {}
    for key, (name, _) in KEYS.items():
        value = _value(host, name)
        if name in skip or not _written(name, value) or (name == "host" and value == host.name):
            continue
        out[key] = value
    for key, value in host.extra.items():
        if key in KEYS:
            raise ValueError(f"host {host.name!r}: extra variable {key} is the field {KEYS[key][0]}: set that")
        out[key] = value
    return out


def inventory_data(hosts: Sequence[HostConfig], *, group: str = "san",
                   shared: Collection[str] = ()) -> dict[str, object]:
    """The inventory mapping for ``hosts``, all in ``group`` (their own ``groups`` are not written).

    ``shared`` names HostConfig fields written once, in the group's ``vars``, rather than under each
    host; every host must have the same value for each of them.
    """
    unknown = [name for name in shared if name not in FIELD_KEYS]
    if unknown:
        raise ValueError(f"shared: {', '.join(map(repr, unknown))} is no HostConfig field with an inventory key")
    common: dict[str, object] = {}
    for name, key in FIELD_KEYS.items():  # in table order
        values = [_value(h, name) for h in hosts]
        if name not in shared or not values:
            continue
        if any(v != values[0] for v in values):
            raise ValueError(f"shared: the hosts differ in {name}: {', '.join(map(repr, values))}")
        if _written(name, values[0]):
            common[key] = values[0]
    body: dict[str, object] = {}
    if common:
        body["vars"] = common
    body["hosts"] = {h.name: host_vars(h, skip=shared) for h in hosts}
    return {"all": {"children": {group: body}}}


def write_inventory(path: str | Path, hosts: Sequence[HostConfig], *, group: str = "san",
                    shared: Collection[str] = (), comment: str = "") -> Path:
    """Write :func:`inventory_data` to ``path`` (replaced at once, never seen half-written); ``path``.

    YAML, after ``comment`` as ``#`` lines; a ``.json`` path gets JSON (which YAML reads too) and no
    comment.
    """
    path = Path(path)
    data = inventory_data(hosts, group=group, shared=shared)
    if path.suffix == ".json":
        if comment:
            raise ValueError(f"{path}: JSON has no comments")
        text = json.dumps(data, indent=2) + "\n"
    else:
        import yaml

        header = "".join(f"# {line}\n" for line in comment.splitlines())
        text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
