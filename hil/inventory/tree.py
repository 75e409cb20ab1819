"""The group tree an inventory describes, whatever its form, and the precedence of its variables.

The YAML and INI readers fill a :class:`GroupTree` with validated variables; ``group_vars/`` and
``host_vars/`` files add theirs as layers above the file's own (:mod:`hil.inventory.vars_dirs`);
:meth:`GroupTree.inventory` turns the whole into an :class:`~hil.inventory.model.Inventory`. Standard
library only.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from hil.inventory.keys import make_host
from hil.inventory.model import HostConfig, Inventory, Source

__all__ = ["GroupTree"]

Vars = dict[str, object]


class GroupTree:
    """Groups, their children, their hosts and everyone's variables, in the order the file gives them.

    A host's variables, lowest first, as Ansible merges them: the inventory file's ``all`` vars, its other
    groups' vars (by depth, then name), ``group_vars/all``, the other ``group_vars/`` files (by depth, then
    name), the file's host vars, ``host_vars/<host>``. So any group_vars file beats any group vars written in
    the inventory file, as in Ansible's precedence list ("inventory group_vars/*" above "inventory file
    group vars").
    """

    def __init__(self, src: Source) -> None:
        self.src = src
        self.group_vars: dict[str, Vars] = {}
        self.children: dict[str, list[str]] = {}
        self.direct_hosts: dict[str, list[str]] = {}
        self.host_vars: dict[str, Vars] = {}  # insertion order is file order
        self.edge_where: dict[tuple[str, str], str] = {}  # where a parent -> child edge is written (INI lines)
        self.file_group_vars: dict[str, Vars] = {}  # from group_vars/
        self.file_host_vars: dict[str, Vars] = {}  # from host_vars/
        self.group("all")

    def group(self, name: str) -> None:
        self.group_vars.setdefault(name, {})
        self.children.setdefault(name, [])
        self.direct_hosts.setdefault(name, [])

    def child(self, parent: str, child: str, where: str = "") -> None:
        self.group(parent)
        self.group(child)
        if child not in self.children[parent]:
            self.children[parent].append(child)
            if where:
                self.edge_where[(parent, child)] = where

    def host(self, group: str, name: str, variables: Vars) -> None:
        """``name`` is in ``group``; its own ``variables`` (validated) update those given before."""
        self.group(group)
        self.host_vars.setdefault(name, {}).update(variables)
        if name not in self.direct_hosts[group]:
            self.direct_hosts[group].append(name)

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
            variables: Vars = {}
            for layer in (self.group_vars, self.file_group_vars):  # "all" sorts first: depth 0
                for group in mine:
                    variables.update(layer.get(group, {}))
            variables.update(self.host_vars[host])
            variables.update(self.file_host_vars.get(host, {}))
            hosts[host] = make_host(host, variables, tuple(g for g in mine if g != "all"))
        return Inventory(path=path, hosts=hosts, groups=groups)

    def _check_cycles(self) -> None:
        # Groups referenced by name can loop without any nesting; in INI a loop may not even reach "all".
        done: set[str] = set()

        def visit(group: str, path: tuple[str, ...]) -> None:
            if group in path:
                where = self.edge_where.get((path[-1], group))
                raise self.src.error(f"group cycle: {' -> '.join((*path, group))}" + (f" ({where})" if where else ""))
            if group in done:
                return
            for kid in self.children[group]:
                visit(kid, (*path, group))
            done.add(group)

        for group in ["all", *self.children]:
            visit(group, ())
