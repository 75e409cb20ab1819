"""Reading an inventory file, YAML or INI, and the ``group_vars/`` and ``host_vars/`` beside it, without Ansible.

The form is told by the file's suffix (``.yaml``, ``.yml``, ``.json``: YAML; ``.ini``, ``.cfg``: INI) or,
without one of those, by its content: a first line like ``[san]`` is INI, a YAML mapping is YAML, and
what YAML reads as plain text (host names, ``host key=value`` lines) is INI. Variables are inherited down
the group tree in Ansible's order (:class:`~hil.inventory.tree.GroupTree`). Every problem is an
:class:`~hil.inventory.model.InventoryError` naming the file (the inventory or a vars file) and, where it
applies, the line, the group or host, the key and the offending value.
"""

from __future__ import annotations

from pathlib import Path

from hil.inventory.ini_inventory import looks_like_ini, read_ini
from hil.inventory.model import Inventory, InventoryError, Source, show
from hil.inventory.tree import GroupTree
from hil.inventory.vars_dirs import read_vars_dirs
from hil.inventory.yaml_inventory import load_yaml, read_yaml

__all__ = ["load_inventory"]

_YAML_SUFFIXES = (".yaml", ".yml", ".json")
_INI_SUFFIXES = (".ini", ".cfg")


def load_inventory(path: str | Path, *, check_files: bool = True) -> Inventory:
    """Read and validate an inventory file and the ``group_vars/``, ``host_vars/`` beside it.

    ``check_files=False`` skips the existence check of key and known_hosts files (a lab not yet up).
    """
    path = Path(path)
    src = Source(str(path), path.absolute().parent, check_files)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise src.error("inventory file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise src.error(f"cannot read inventory: {exc}") from None
    tree = _tree(path, text, src)
    read_vars_dirs(tree, path)
    try:
        return tree.inventory(path)
    except RecursionError:
        raise src.error("groups nested too deeply") from None


def _tree(path: Path, text: str, src: Source) -> GroupTree:
    suffix = path.suffix.lower()
    # A first line like "[san]" is a YAML list that can never be an inventory: it is INI whatever the suffix
    # (JSON aside, where "[...]" is what a list looks like).
    if suffix in _INI_SUFFIXES or (suffix != ".json" and looks_like_ini(text)):
        return read_ini(text, src)
    if suffix in _YAML_SUFFIXES:
        return read_yaml(load_yaml(text, src), src)
    prefix = f"{src.label}: "
    plain_text = False
    try:
        data = load_yaml(text, src)
        if isinstance(data, dict):
            return read_yaml(data, src)
        plain_text = data is None or isinstance(data, str)  # host names, "host key=value" lines: INI
        not_yaml = f"expected a mapping with an 'all' group at the top level, got {show(data)}"
    except InventoryError as exc:
        not_yaml = str(exc).removeprefix(prefix)
    try:
        return read_ini(text, src)
    except InventoryError as not_ini:
        if plain_text:
            raise
        raise src.error(f"neither a YAML inventory ({not_yaml}) nor an INI one "
                        f"({str(not_ini).removeprefix(prefix)})") from None
