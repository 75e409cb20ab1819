"""Reading an Ansible-style YAML inventory (``all`` -> ``children`` -> ``hosts``/``vars``) without Ansible.

Variables are inherited down the group tree; a host's own variables beat its groups', and deeper groups
beat shallower ones (ties broken by group name, as Ansible does). Every problem is an
:class:`~hil.inventory.model.InventoryError` naming the file and, where it applies, the group or host,
the key and the offending value. PyYAML is imported by :func:`load_inventory`, not by this module.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hil.inventory.keys import make_host, parse_vars
from hil.inventory.model import HostConfig, Inventory, Source, check_host_name, no_control, show

if TYPE_CHECKING:
    import yaml

__all__ = ["load_inventory"]


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


_GROUP_SECTIONS = ("hosts", "vars", "children")


class _Reader:
    """Walks the group tree once, collecting vars, edges and hosts in file order."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.group_vars: dict[str, dict[str, object]] = {}
        self.children: dict[str, list[str]] = {}
        self.direct_hosts: dict[str, list[str]] = {}
        self.host_vars: dict[str, dict[str, object]] = {}  # insertion order is file order

    def group(self, name: str, body: object) -> None:
        # The tree is finite (the loader refuses recursive anchors); cycles by name are found later.
        where = f"group {name!r}"
        self.group_vars.setdefault(name, {})
        self.children.setdefault(name, [])
        self.direct_hosts.setdefault(name, [])
        if body is None:
            return
        if not isinstance(body, dict):
            raise self.src.error(where, f"expected a mapping with hosts, vars or children, got {show(body)}")
        for section in body:
            if section not in _GROUP_SECTIONS:
                raise self.src.error(
                    where, f"unknown section {show(section)}; expected {', '.join(_GROUP_SECTIONS)}"
                )
        self.group_vars[name].update(parse_vars(body.get("vars"), self.src, f"{where}: vars"))
        for host, host_body in self._entries(body.get("hosts"), where, "hosts", "host names"):
            if re.search(r"\[.*:.*\]", host):  # Ansible's node[1:3] ranges would otherwise be a hostname
                raise self.src.error(f"host {host!r}", "host ranges are not supported; list each host")
            check_host_name(host, self.src)
            variables = parse_vars(host_body, self.src, f"host {host!r}")
            self.host_vars.setdefault(host, {}).update(variables)
            if host not in self.direct_hosts[name]:
                self.direct_hosts[name].append(host)
        for child, child_body in self._entries(body.get("children"), where, "children", "group names"):
            if child not in self.children[name]:
                self.children[name].append(child)
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

    def inventory(self, path: Path) -> Inventory:
        self._check_cycles()
        parents: dict[str, list[str]] = {g: [] for g in self.children}
        for group, kids in self.children.items():
            for kid in kids:
                parents[kid].append(group)

        @cache
        def depth(group: str) -> int:  # longest path from "all", as Ansible orders group vars
            return max((depth(p) + 1 for p in parents[group]), default=0)

        @cache
        def members(group: str) -> frozenset[str]:
            nested = (members(kid) for kid in self.children[group])
            return frozenset(self.direct_hosts[group]).union(*nested)

        order = list(self.host_vars)
        groups = {g: tuple(h for h in order if h in members(g)) for g in self.children}
        hosts: dict[str, HostConfig] = {}
        for host in order:
            mine = sorted((g for g in groups if host in members(g)), key=lambda g: (depth(g), g))
            variables: dict[str, object] = {}
            for group in mine:
                variables.update(self.group_vars[group])
            variables.update(self.host_vars[host])
            hosts[host] = make_host(host, variables, tuple(g for g in mine if g != "all"))
        return Inventory(path=path, hosts=hosts, groups=groups)

    def _check_cycles(self) -> None:
        # Groups defined in one place and referenced by name in another can loop without any nesting.
        done: set[str] = set()

        def visit(group: str, path: tuple[str, ...]) -> None:
            if group in path:
                raise self.src.error(f"group cycle: {' -> '.join((*path, group))}")
            if group in done:
                return
            for kid in self.children[group]:
                visit(kid, (*path, group))
            done.add(group)

        visit("all", ())


def load_inventory(path: str | Path, *, check_files: bool = True) -> Inventory:
    """Read and validate an inventory file.

    ``check_files=False`` skips the existence check of key and known_hosts files (a lab not yet up).
    """
    import yaml

    path = Path(path)
    src = Source(str(path), path.absolute().parent, check_files)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise src.error("inventory file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise src.error(f"cannot read inventory: {exc}") from None
    try:
        data = yaml.load(text, Loader=_strict_loader())
    except RecursionError:
        raise src.error("YAML error: nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise src.error(f"{where}YAML error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise src.error(f"YAML error: {exc}") from None
    if not isinstance(data, dict):
        raise src.error(f"expected a mapping with an 'all' group at the top level, got {show(data)}")
    if "all" not in data:
        raise src.error(f"no 'all' group at the top level (found {', '.join(map(show, data))})")
    others = [k for k in data if k != "all"]
    if others:  # Ansible would accept these as children of all; we ask for one explicit tree
        raise src.error(f"unexpected top-level key {show(others[0])}; put groups under all: children:")
    reader = _Reader(src)
    try:
        reader.group("all", data["all"])
        return reader.inventory(path)
    except RecursionError:
        raise src.error("groups nested too deeply") from None
