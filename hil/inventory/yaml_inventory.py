"""The YAML form of an inventory (``all`` -> ``children`` -> ``hosts``/``vars``), and YAML vars files.

:func:`load_yaml` parses text strictly (duplicate keys are errors) into plain data, naming the line of a
syntax error; :func:`read_yaml` walks an inventory's group tree into a
:class:`~hil.inventory.tree.GroupTree`. PyYAML is imported when they run, not with this module.
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING, Any

from hil.inventory.keys import parse_vars
from hil.inventory.model import Source, check_host_name, no_control, show
from hil.inventory.tree import GroupTree

if TYPE_CHECKING:
    import yaml

__all__ = ["load_yaml", "read_yaml"]


@cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """SafeLoader that refuses duplicate keys: PyYAML would silently keep the last one."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *anchor" may legitimately repeat keys
                continue
            key = loader.construct_object(key_node)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {type(key).__name__} cannot be a key", key_node.start_mark) from None
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def load_yaml(text: str, src: Source) -> object:
    """``text`` as data; a syntax error is an InventoryError naming the line and column."""
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())
    except RecursionError:
        raise src.error("YAML error: nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise src.error(f"{where}YAML error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise src.error(f"YAML error: {exc}") from None


def read_yaml(data: object, src: Source) -> GroupTree:
    """The group tree of a loaded YAML inventory: one ``all`` group at the top."""
    if not isinstance(data, dict):
        raise src.error(f"expected a mapping with an 'all' group at the top level, got {show(data)}")
    if "all" not in data:
        raise src.error(f"no 'all' group at the top level (found {', '.join(map(show, data))})")
    others = [k for k in data if k != "all"]
    if others:  # Ansible would accept these as children of all; we ask for one explicit tree
        raise src.error(f"unexpected top-level key {show(others[0])}; put groups under all: children:")
    tree = GroupTree(src)
    try:
        _Walker(tree).group("all", data["all"])
    except RecursionError:
        raise src.error("groups nested too deeply") from None
    return tree


_GROUP_SECTIONS = ("hosts", "vars", "children")


class _Walker:
    """Walks the group tree once, collecting vars, edges and hosts in file order."""

    def __init__(self, tree: GroupTree) -> None:
        self.tree = tree
        self.src = tree.src

    def group(self, name: str, body: object) -> None:
        # The tree is finite (the loader refuses recursive anchors); cycles by name are found later.
        where = f"group {name!r}"
        self.tree.group(name)
        if body is None:
            return
        if not isinstance(body, dict):
            raise self.src.error(where, f"expected a mapping with hosts, vars or children, got {show(body)}")
        for section in body:
            if section not in _GROUP_SECTIONS:
                raise self.src.error(
                    where, f"unknown section {show(section)}; expected {', '.join(_GROUP_SECTIONS)}"
                )
        self.tree.group_vars[name].update(parse_vars(body.get("vars"), self.src, f"{where}: vars"))
        for host, host_body in self._entries(body.get("hosts"), where, "hosts", "host names"):
            if re.search(r"\[.*:.*\]", host):  # Ansible's node[1:3] ranges would otherwise be a hostname
                raise self.src.error(f"host {host!r}", "host ranges are not supported; list each host")
            check_host_name(host, self.src)
            self.tree.host(name, host, parse_vars(host_body, self.src, f"host {host!r}"))
        for child, child_body in self._entries(body.get("children"), where, "children", "group names"):
            self.tree.child(name, child)
            self.group(child, child_body)

    def _entries(self, raw: object, where: str, section: str, what: str) -> list[tuple[str, object]]:
        if raw is None:
            return []
        if not isinstance(raw, dict):
            raise self.src.error(where, f"{section}: expected a mapping of {what}, got {show(raw)}")
        for key in raw:
            if not isinstance(key, str) or not key:
                raise self.src.error(where, f"{section}: {what} must be non-empty strings, got {show(key)}")
            no_control(key, self.src, where, section)
        return list(raw.items())
