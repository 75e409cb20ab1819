"""What a lab host is (:class:`HostConfig`), the rule each of its values follows, and a loaded inventory.

Standard library only: code that just passes hosts around imports this, never PyYAML. The checks here
look at one value at a time; :mod:`hil.inventory.keys` says which inventory key each one belongs to.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_PYTHON",
    "Connection",
    "Engine",
    "HostConfig",
    "Inventory",
    "InventoryError",
]

Connection = Literal["ssh", "local"]
Engine = Literal["verbs", "emulator"]

DEFAULT_PORT = 22
DEFAULT_PYTHON = "/usr/bin/python3"  # pyverbs exists only for the system interpreter on lab hosts


class InventoryError(ValueError):
    """A lab inventory (or host string) that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class HostConfig:
    """One lab host, validated. Field <- inventory key: see ``hil/inventory/examples/README.md``."""

    name: str
    host: str  # ansible_host
    port: int = DEFAULT_PORT  # ansible_port
    user: str | None = None  # ansible_user; None: ssh config / current user
    key_file: Path | None = None  # ansible_ssh_private_key_file, absolute
    python_interpreter: str = DEFAULT_PYTHON  # ansible_python_interpreter: a command line, as Ansible reads it
    connection: Connection = "ssh"  # ansible_connection
    engine: Engine = "verbs"  # san_engine
    device: str | None = None  # san_device; None: first active port
    device_port: int | None = None  # san_port: the device's port number; None: its first ACTIVE port
    netdev: str | None = None  # san_netdev
    gid_index: int | None = None  # san_gid_index
    loopback: bool = False  # san_loopback: both ends of a connection on this host
    known_hosts: Path | None = None  # san_known_hosts, absolute
    groups: tuple[str, ...] = ()  # groups holding the host (not "all"), in the order their vars apply
    extra: Mapping[str, object] = field(default_factory=dict, hash=False)  # other vars, unvalidated

    @property
    def python_argv(self) -> list[str]:
        """How the agent's command line starts: ``/usr/bin/env python3`` is two words, as in a shebang."""
        return shlex.split(self.python_interpreter)


@dataclass(frozen=True)
class Inventory:
    """A loaded inventory: hosts in file order and group -> host names (nested membership included)."""

    path: Path
    hosts: dict[str, HostConfig] = field(hash=False)
    groups: dict[str, tuple[str, ...]] = field(hash=False)

    def select(self, group: str = "san", names: Sequence[str] | None = None) -> list[HostConfig]:
        """The hosts of ``group`` in file order, restricted to ``names`` when given."""
        members = self.groups.get(group, ())
        if not members:
            state = "has no hosts" if group in self.groups else "does not exist"
            raise InventoryError(f"{self.path}: group {group!r} {state}; groups: {', '.join(self.groups)}")
        if names is None:
            return [self.hosts[n] for n in members]
        for name in names:
            if name not in members:
                raise InventoryError(
                    f"{self.path}: host {name!r} is not in group {group!r}; its hosts: {', '.join(members)}"
                )
        return [self.hosts[n] for n in members if n in names]


# --- where values come from, and how a bad one is reported -------------------------------------------


class BadValue(Exception):
    """A value failed validation; the caller adds file, host and key to the message."""


@dataclass(frozen=True)
class Source:
    """Where the values being checked come from: an inventory file or a host string."""

    label: str  # the file path as given, or "host string '...'"
    base: Path  # relative paths resolve against this directory
    check_files: bool

    def error(self, *parts: str) -> InventoryError:
        return InventoryError(": ".join((self.label, *parts)))


Parser = Callable[[object, Source], object]  # checks one value and returns it typed, or raises BadValue


def show(value: object) -> str:
    """A value as an error message shows it: its repr, shortened."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- the rule of each kind of value ----------------------------------------------------------------


def text(value: object, src: Source) -> str:
    if not isinstance(value, str) or not value:
        raise BadValue(f"expected a non-empty string, got {show(value)}")
    return value


# A host's inventory name (it travels on the agent's command line) and its address: never an option.
HOST_NAME = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9._:%-]{0,252}")
HOST_RULE = "letters, digits, '.', '_', '-', ':' or '%', not starting with '-' or '.'"


def check_host_name(name: str, src: Source) -> None:
    if not HOST_NAME.fullmatch(name):
        raise src.error(f"host {show(name)}", f"not a usable host name ({HOST_RULE})")


def address(value: object, src: Source) -> str:
    name = text(value, src)
    if not HOST_NAME.fullmatch(name):
        raise BadValue(f"not a host name or address ({HOST_RULE}): {show(name)}")
    return name


_DISCOVERY = ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent")


def interpreter(value: object, src: Source) -> str:
    """A command line split like a shell (and Ansible) would: ``/usr/bin/env python3`` is two words."""
    line = text(value, src)
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise BadValue(f"cannot split {show(line)} into words: {exc}") from None
    if not words:
        raise BadValue(f"expected an interpreter, got {show(line)}")
    if words[0] in _DISCOVERY:
        raise BadValue(f"Ansible's interpreter discovery ({words[0]!r}) is not supported: give the interpreter, "
                       f"e.g. {DEFAULT_PYTHON}")
    if words[0].startswith("-"):
        raise BadValue(f"expected an interpreter before any option, got {show(line)}")
    return line


def integer(low: int, high: int | None, wanted: str) -> Parser:
    def parse(value: object, src: Source) -> int:
        # Digit strings are accepted because host strings (and some inventories) carry text.
        if isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue(f"expected {wanted}, got {show(value)}")
        if value < low or (high is not None and value > high):
            raise BadValue(f"expected {wanted}, got {show(value)}")
        return value

    return parse


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def boolean(value: object, src: Source) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, int)) and str(value).lower() in _TRUE | _FALSE:
        return str(value).lower() in _TRUE
    raise BadValue(f"expected true or false, got {show(value)}")


def choice(options: tuple[str, ...]) -> Parser:
    def parse(value: object, src: Source) -> str:
        if value not in options:
            raise BadValue(f"expected one of {', '.join(map(repr, options))}, got {show(value)}")
        return value  # narrowed to str by the membership test

    return parse


def file(value: object, src: Source) -> Path:
    given = text(value, src)
    try:
        path = Path(given).expanduser()
    except RuntimeError as exc:  # ~user of an unknown user
        raise BadValue(f"{exc} (from {given!r})") from None
    if not path.is_absolute():  # relative to the inventory, so the lab directory can move as a whole
        path = src.base / path
    try:
        found = not src.check_files or path.is_file()
    except OSError as exc:
        raise BadValue(f"cannot check {str(path)!r}: {exc.strerror or exc} (from {given!r})") from None
    if not found:
        raise BadValue(f"file not found: {str(path)!r} (from {given!r})")
    return path


def optional(parse: Parser) -> Parser:
    return lambda value, src: None if value is None else parse(value, src)


# --- control characters ----------------------------------------------------------------------------

# Control characters (NUL above all) have no place in a value we use; in vars we only pass along, the
# layout characters tab, newline and carriage return are allowed (a multi-line value is legitimate YAML).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
CONTROL_BUT_LAYOUT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _control(value: object, pattern: re.Pattern[str], seen: set[int] | None = None) -> str | None:
    """The first string in ``value`` (nested keys and items included) holding a control character."""
    if isinstance(value, str):
        return value if pattern.search(value) else None
    if not isinstance(value, (dict, list, tuple, set, frozenset)):
        return None
    seen = set() if seen is None else seen
    if id(value) in seen:  # YAML aliases share (and may nest) containers
        return None
    seen.add(id(value))
    items = [x for pair in value.items() for x in pair] if isinstance(value, dict) else list(value)
    return next((found for item in items if (found := _control(item, pattern, seen)) is not None), None)


def no_control(value: object, src: Source, *where: str, pattern: re.Pattern[str] = CONTROL) -> None:
    """Raise the InventoryError for the first control character in ``value`` (see CONTROL)."""
    found = _control(value, pattern)
    if found is not None:
        char = pattern.search(found)
        assert char is not None
        raise src.error(*where, f"control character {char.group()!r} in {show(found)}; remove it")
