"""Lab inventory: which hosts the HIL backend drives and how to reach them.

The file is an Ansible inventory, YAML (``all`` -> ``children`` -> ``hosts``/``vars``) or INI (``[group]``,
``[group:vars]``, ``[group:children]``), with the ``group_vars/`` and ``host_vars/`` directories beside it,
read without Ansible; one-off hosts can be given as strings (``ssh://root@127.0.0.1:10022?engine=verbs``).
``hil/inventory/examples/README.md`` explains every key.

- ``hil.inventory.model``: :class:`HostConfig` (one host), :class:`Inventory` (a loaded file),
  :class:`InventoryError`, and the rule each value follows. Standard library only.
- ``hil.inventory.keys``: the one table of inventory keys (``ansible_port`` <-> ``HostConfig.port``
  ...), which keys are errors and which are kept in ``HostConfig.extra``.
- ``hil.inventory.reader``: :func:`load_inventory`: which form a file is, then the rest.
- ``hil.inventory.yaml_inventory``, ``hil.inventory.ini_inventory``: the two forms, each into a
  ``hil.inventory.tree`` (groups, hosts and the precedence of their variables).
- ``hil.inventory.vars_dirs``: ``group_vars/`` and ``host_vars/``.
- ``hil.inventory.hoststring``: :func:`parse_host_string`.
- ``hil.inventory.writer``: :func:`write_inventory`, hosts as a file the reader reads back.

Importing this package does not import PyYAML: the readers and the writer import it when they run (an INI
inventory without vars directories never does).
"""

from __future__ import annotations

from hil.inventory.hoststring import parse_host_string
from hil.inventory.model import DEFAULT_PORT, DEFAULT_PYTHON, Connection, Engine, HostConfig, Inventory, InventoryError
from hil.inventory.reader import load_inventory
from hil.inventory.writer import inventory_data, write_inventory

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_PYTHON",
    "Connection",
    "Engine",
    "HostConfig",
    "Inventory",
    "InventoryError",
    "inventory_data",
    "load_inventory",
    "parse_host_string",
    "write_inventory",
]
