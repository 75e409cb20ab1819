"""The INI form of an inventory, as Ansible's ``ini`` inventory plugin reads it, without Ansible::

    node0 ansible_connection=local      # hosts before any section are in "all" only
    [san]                               # a group and its hosts, each with key=value variables
    node1 ansible_host=10.0.0.1 ansible_port=10022
    [san:vars]                          # one key=value a line, for every host of the group
    san_device=rxe0
    [lab:children]                      # groups in this group (each declared by a section of its own)
    san
    [all:vars]
    ansible_user=root

Values are read as ansible-core reads them (``lib/ansible/plugins/inventory/ini.py``): a host line is split
into words like a shell line (quotes group and are removed, ``#`` starts a comment), a ``:vars`` line is
``key=value`` with everything after the first ``=``; then each value is a Python literal where it parses as
one (``22`` is an int, ``True`` a bool, ``'22'`` a string), else the text itself. Every problem names the
file, the line number and the line. Standard library only.
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings

from hil.inventory.keys import parse_vars
from hil.inventory.model import HOST_NAME, HOST_RULE, InventoryError, Source, no_control, show
from hil.inventory.tree import GroupTree

__all__ = ["looks_like_ini", "read_ini"]

# Ansible's patterns: "[name]" or "[name:kind]", then optional blanks and a "#" comment.
_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?")
_GROUP_NAME = re.compile(r"([^:\]\s]+)\s*(?:#.*)?")
_KINDS = ("hosts", "vars", "children")
_COMMENT = ("#", ";")


def _lines(text: str) -> list[str]:
    # Only "\n" ends a line (str.splitlines also splits at \x0b, \x1c..., which editors do not), so line
    # numbers are the ones an editor shows.
    return text.removeprefix("\ufeff").split("\n")


def looks_like_ini(text: str) -> bool:
    """Whether the first line that is not blank or a comment is an INI section header (``[san]``)."""
    for line in _lines(text):
        line = line.strip()
        if line and not line.startswith(_COMMENT):
            return _SECTION.fullmatch(line) is not None
    return False


def read_ini(text: str, src: Source) -> GroupTree:
    """The group tree of an INI inventory; the first problem found is an InventoryError naming its line."""
    return _IniReader(src).read(text)


class _Line(Exception):
    """A problem with the current line; the reader adds the file, the line number and the line."""


class _IniReader:
    def __init__(self, src: Source) -> None:
        self.src = src
        self.tree = GroupTree(src)
        self.declared = {"all"}  # by a [name] or [name:children] header ("all" always exists)
        self.pending: dict[str, InventoryError] = {}  # group -> the error for the first line that needs it
        self.var_lines: dict[tuple[str, str], int] = {}  # (group, key) -> the line setting it

    def read(self, text: str) -> GroupTree:
        group, kind = "all", "hosts"  # hosts before any section are in "all" (Ansible's "ungrouped")
        for number, raw in enumerate(_lines(text), 1):
            line = raw.strip()
            if not line or line.startswith(_COMMENT):
                continue
            at = f"line {number}"
            try:
                section = _SECTION.fullmatch(line)
                if section:
                    group, kind = self._section(section, line, at)
                elif line.startswith("[") and line.endswith("]"):
                    raise _Line("not a section header: write [group], [group:vars] or [group:children], "
                                "without blanks")
                elif kind == "hosts":
                    self._host(group, line, at)
                elif kind == "vars":
                    self._var(group, line, number, at)
                else:
                    self._child(group, line, at)
            except _Line as problem:
                raise self.src.error(at, show(line), str(problem)) from None
        for group, error in self.pending.items():
            if group not in self.declared:
                raise error
        nested = {kid for kids in self.tree.children.values() for kid in kids}
        for group in list(self.tree.children):  # as Ansible does: a group in no other group is in "all"
            if group != "all" and group not in nested:
                self.tree.child("all", group)
        return self.tree

    def _section(self, section: re.Match[str], line: str, at: str) -> tuple[str, str]:
        name, kind = section.group(1), section.group(2) or "hosts"
        if kind not in _KINDS:
            raise _Line(f"unknown section kind {kind!r}; expected {', '.join(_KINDS)}")
        no_control(name, self.src, at, "group name")
        self.tree.group(name)
        if kind == "vars":  # a group needs declaring by [name] or [name:children] somewhere in the file
            self.pending.setdefault(name, self.src.error(
                at, show(line), f"group {name!r} is never declared: add a [{name}] section"))
        else:
            self.declared.add(name)
        return name, kind

    def _host(self, group: str, line: str, at: str) -> None:
        try:
            words = shlex.split(line, comments=True)  # as Ansible splits host lines
        except ValueError as exc:
            raise _Line(f"cannot split the line into words: {exc}") from None
        if not words:
            return
        name, port = _host_pattern(words[0])
        variables: dict[str, object] = {} if port is None else {"ansible_port": port}
        given: set[str] = set()
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if not equals or not key:
                raise _Line(f"expected key=value after the host name, got {show(word)}")
            if key in given:
                raise _Line(f"{key} given twice")
            given.add(key)
            variables[key] = _value(value)
        self.tree.host(group, name, parse_vars(variables, self.src, f"{at}: host {name!r}"))

    def _var(self, group: str, line: str, number: int, at: str) -> None:
        key, equals, value = (part.strip() for part in line.partition("="))
        if not equals or not key:
            raise _Line("expected key=value")
        first = self.var_lines.setdefault((group, key), number)
        if first != number:
            raise _Line(f"{key} is already set for group {group!r} on line {first}")
        variables = parse_vars({key: _value(value)}, self.src, f"{at}: group {group!r}: vars")
        self.tree.group_vars[group].update(variables)

    def _child(self, group: str, line: str, at: str) -> None:
        match = _GROUP_NAME.fullmatch(line)
        if not match:
            raise _Line("expected a group name")
        child = match.group(1)
        no_control(child, self.src, at, "group name")
        self.tree.child(group, child, f"{at}: {show(line)}")
        self.pending.setdefault(child, self.src.error(
            at, show(line), f"group {child!r} (in [{group}:children]) is never declared: add a [{child}] section"
        ))


def _host_pattern(word: str) -> tuple[str, int | None]:
    """``name``, ``name:port``, ``[IPv6]:port`` or a bare IPv6 address -> (name, port)."""
    port: str | None = None
    if word.startswith("["):
        match = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", word)
        if not match or ":" not in match.group(1):
            raise _Line(f"host ranges ({word}) are not supported; list each host")
        name, port = match.group(1), match.group(2)
    elif "[" in word or "]" in word:  # Ansible's node[1:3] ranges
        raise _Line(f"host ranges ({word}) are not supported; list each host")
    elif word.count(":") == 1:
        name, _, port = word.partition(":")
    else:
        name = word
    if port is not None and not re.fullmatch(r"[0-9]{1,5}", port):
        raise _Line(f"expected host:port with a port number, got {show(word)}")
    if not HOST_NAME.fullmatch(name):
        raise _Line(f"host {show(name)}: not a usable host name ({HOST_RULE})")
    return name, None if port is None else int(port)


def _value(text: str) -> object:
    """A value as ansible-core reads it: a Python literal where ``text`` is one, else ``text`` itself."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "invalid escape sequence" and the like
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError):  # a word, not a literal (Ansible keeps the text)
        return text
    except (TypeError, RecursionError, MemoryError) as exc:  # {[1]}: Ansible fails here too
        raise _Line(f"cannot read the value {show(text)}: {type(exc).__name__}: {exc}") from None
    return _plain(value)


def _plain(value: object) -> object:
    """What Ansible makes of a literal: tuples and sets are lists, bytes and complex numbers text."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, complex) or value is Ellipsis:
        return "..." if value is Ellipsis else str(value)
    return value
