"""Lab inventory: which hosts the HIL backend drives and how to reach them.

The file is an Ansible-style YAML inventory (``all`` -> ``children`` -> ``hosts``/``vars``), read here
with PyYAML alone so that the lab needs no Ansible installation. Variables are inherited down the group
tree; a host's own variables beat its groups', and deeper groups beat shallower ones (ties broken by
group name, as Ansible does). Every problem is an :class:`InventoryError` naming the file and, where it
applies, the group or host, the key and the offending value.

One-off hosts can be given as strings instead (testinfra style)::

    ssh://root@127.0.0.1:10022?engine=verbs&gid_index=1
    local://?engine=emulator&loopback=1
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml

__all__ = ["HostConfig", "Inventory", "InventoryError", "load_inventory", "parse_host_string"]

Connection = Literal["ssh", "local"]
Engine = Literal["verbs", "emulator"]

DEFAULT_PORT = 22
DEFAULT_PYTHON = "/usr/bin/python3"  # pyverbs exists only for the system interpreter on lab hosts


class InventoryError(ValueError):
    """A lab inventory (or host string) that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class HostConfig:
    """One lab host, validated. Field <- inventory key: see ``inventory/README.md``."""

    name: str
    host: str  # ansible_host
    port: int = DEFAULT_PORT  # ansible_port
    user: str | None = None  # ansible_user; None: ssh config / current user
    key_file: Path | None = None  # ansible_ssh_private_key_file, absolute
    python_interpreter: str = DEFAULT_PYTHON  # ansible_python_interpreter: a command line, as Ansible reads it
    connection: Connection = "ssh"  # ansible_connection
    engine: Engine = "verbs"  # san_engine
    device: str | None = None  # san_device; None: first active port
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


# --- validation of single values ------------------------------------------------------------------


class _Bad(Exception):
    """A value failed validation; the caller adds file, host and key to the message."""


@dataclass(frozen=True)
class _Source:
    label: str  # the file path as given, or "host string '...'"
    base: Path  # relative paths resolve against this directory
    check_files: bool

    def error(self, *parts: str) -> InventoryError:
        return InventoryError(": ".join((self.label, *parts)))


_Parser = Callable[[object, _Source], object]


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: object, src: _Source) -> str:
    if not isinstance(value, str) or not value:
        raise _Bad(f"expected a non-empty string, got {_show(value)}")
    return value


# A host's inventory name (it travels on the agent's command line) and its address: never an option.
_HOST_NAME = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9._:%-]{0,252}")
_HOST_RULE = "letters, digits, '.', '_', '-', ':' or '%', not starting with '-' or '.'"


def _address(value: object, src: _Source) -> str:
    text = _text(value, src)
    if not _HOST_NAME.fullmatch(text):
        raise _Bad(f"not a host name or address ({_HOST_RULE}): {_show(text)}")
    return text


_DISCOVERY = ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent")


def _interpreter(value: object, src: _Source) -> str:
    """A command line split like a shell (and Ansible) would: ``/usr/bin/env python3`` is two words."""
    text = _text(value, src)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise _Bad(f"cannot split {_show(text)} into words: {exc}") from None
    if not words:
        raise _Bad(f"expected an interpreter, got {_show(text)}")
    if words[0] in _DISCOVERY:
        raise _Bad(f"Ansible's interpreter discovery ({words[0]!r}) is not supported: give the interpreter, "
                   f"e.g. {DEFAULT_PYTHON}")
    if words[0].startswith("-"):
        raise _Bad(f"expected an interpreter before any option, got {_show(text)}")
    return text


def _integer(low: int, high: int | None, wanted: str) -> _Parser:
    def parse(value: object, src: _Source) -> int:
        # Digit strings are accepted because host strings (and some inventories) carry text.
        if isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"expected {wanted}, got {_show(value)}")
        if value < low or (high is not None and value > high):
            raise _Bad(f"expected {wanted}, got {_show(value)}")
        return value

    return parse


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _boolean(value: object, src: _Source) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, int)) and str(value).lower() in _TRUE | _FALSE:
        return str(value).lower() in _TRUE
    raise _Bad(f"expected true or false, got {_show(value)}")


def _choice(options: tuple[str, ...]) -> _Parser:
    def parse(value: object, src: _Source) -> str:
        if value not in options:
            raise _Bad(f"expected one of {', '.join(map(repr, options))}, got {_show(value)}")
        return value  # narrowed to str by the membership test

    return parse


def _file(value: object, src: _Source) -> Path:
    given = _text(value, src)
    try:
        path = Path(given).expanduser()
    except RuntimeError as exc:  # ~user of an unknown user
        raise _Bad(f"{exc} (from {given!r})") from None
    if not path.is_absolute():  # relative to the inventory, so the lab directory can move as a whole
        path = src.base / path
    try:
        found = not src.check_files or path.is_file()
    except OSError as exc:
        raise _Bad(f"cannot check {str(path)!r}: {exc.strerror or exc} (from {given!r})") from None
    if not found:
        raise _Bad(f"file not found: {str(path)!r} (from {given!r})")
    return path


def _optional(parse: _Parser) -> _Parser:
    return lambda value, src: None if value is None else parse(value, src)


# inventory key -> (HostConfig field, parser)
_KEYS: dict[str, tuple[str, _Parser]] = {
    "ansible_host": ("host", _address),
    "ansible_port": ("port", _integer(1, 65535, "an integer 1-65535")),
    "ansible_user": ("user", _optional(_text)),
    "ansible_ssh_private_key_file": ("key_file", _optional(_file)),
    "ansible_python_interpreter": ("python_interpreter", _interpreter),
    "ansible_connection": ("connection", _choice(("ssh", "local"))),
    "san_engine": ("engine", _choice(("verbs", "emulator"))),
    "san_device": ("device", _optional(_text)),
    "san_netdev": ("netdev", _optional(_text)),
    "san_gid_index": ("gid_index", _optional(_integer(0, None, "an integer >= 0"))),
    "san_loopback": ("loopback", _boolean),
    "san_known_hosts": ("known_hosts", _optional(_file)),
}
# Our keys that are validated but travel in ``HostConfig.extra`` (read by the part that needs them).
_EXTRA_KEYS: dict[str, _Parser] = {
    "san_remote_tmp": _text,  # where the agent is pushed on the host (default /tmp)
    "san_lab_address": _text,  # `san-hil lab`: the guest's address on the lab segment (only inside the guests)
}
_SAN_KEYS = sorted([k for k in _KEYS if k.startswith("san_")] + list(_EXTRA_KEYS))
_PASSWORD_KEYS = frozenset(
    {
        "ansible_password",
        "ansible_ssh_pass",
        "ansible_ssh_password",
        "ansible_become_pass",
        "ansible_become_password",
        "ansible_sudo_pass",
        "ansible_ssh_private_key_passphrase",
    }
)
_NO_PASSWORDS = "passwords are not accepted; use SSH keys or ssh-agent"

# Other ansible_ keys. An alias would be silently ignored (and the host reached some other way), so it is
# an error; Ansible's own connection, privilege and shell settings are kept in ``extra`` and ignored on
# purpose; anything else (a typo above all) is an error.
_ANSIBLE_ALIASES = {
    "ansible_ssh_host": "ansible_host",
    "ansible_ssh_port": "ansible_port",
    "ansible_ssh_user": "ansible_user",
    "ansible_private_key_file": "ansible_ssh_private_key_file",
}
_ANSIBLE_IGNORED = frozenset(
    {
        "ansible_become", "ansible_become_method", "ansible_become_user", "ansible_become_exe",
        "ansible_become_flags", "ansible_sudo", "ansible_sudo_user", "ansible_sudo_exe", "ansible_sudo_flags",
        "ansible_su", "ansible_su_user", "ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args",
        "ansible_sftp_extra_args", "ansible_scp_extra_args", "ansible_ssh_executable", "ansible_ssh_pipelining",
        "ansible_pipelining", "ansible_ssh_retries", "ansible_ssh_timeout", "ansible_timeout",
        "ansible_ssh_transfer_method", "ansible_scp_if_ssh", "ansible_sftp_batch_mode", "ansible_ssh_use_tty",
        "ansible_control_path", "ansible_control_path_dir", "ansible_host_key_checking",
        "ansible_ssh_host_key_checking", "ansible_sshpass_prompt", "ansible_shell_type",
        "ansible_shell_executable", "ansible_remote_tmp", "ansible_keep_remote_files", "ansible_async_dir",
        "ansible_module_compression", "ansible_network_os", "ansible_connection_timeout",
        "ansible_command_timeout",
    }
)
# Families of other connection and become plugins' settings (after the typo check).
_ANSIBLE_IGNORED_PREFIXES = (
    "ansible_become_", "ansible_winrm_", "ansible_psrp_", "ansible_docker_", "ansible_podman_",
    "ansible_paramiko_", "ansible_libssh_", "ansible_netconf_", "ansible_httpapi_", "ansible_network_",
    "ansible_kubectl_",
)
_ANSIBLE_READ = sorted(k for k in _KEYS if k.startswith("ansible_"))
_ANSIBLE_KNOWN = sorted({*_ANSIBLE_READ, *_ANSIBLE_IGNORED, *_ANSIBLE_ALIASES, *_PASSWORD_KEYS})


def _ansible_key(key: str) -> str | None:
    """Why an ansible_ key pytest-san does not read is an error, or None when it is ignored on purpose."""
    if key in _ANSIBLE_ALIASES:
        return f"Ansible's other name for {_ANSIBLE_ALIASES[key]}; write that (pytest-san reads only that name)"
    if key in _ANSIBLE_IGNORED:
        return None
    language = re.fullmatch(r"ansible_(\w+)_interpreter", key)
    if language and difflib.SequenceMatcher(None, language.group(1), "python").ratio() < 0.75:
        return None  # ansible_perl_interpreter and the like: not for us
    close = difflib.get_close_matches(key, _ANSIBLE_KNOWN, n=1, cutoff=0.85)
    if not close and not language and key.startswith(_ANSIBLE_IGNORED_PREFIXES):
        return None
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"unknown Ansible variable{hint}; pytest-san reads {', '.join(_ANSIBLE_READ)} and ignores "
            "Ansible's other connection, become and shell settings")


# Control characters (NUL above all) have no place in a value we use; in vars we only pass along, the
# layout characters tab, newline and carriage return are allowed (a multi-line value is legitimate YAML).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LAYOUT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


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


def _no_control(text: object, src: _Source, *where: str, pattern: re.Pattern[str] = _CONTROL) -> None:
    found = _control(text, pattern)
    if found is not None:
        char = pattern.search(found)
        assert char is not None
        raise src.error(*where, f"control character {char.group()!r} in {_show(found)}; remove it")


def _parse_vars(raw: object, src: _Source, where: str) -> dict[str, object]:
    """Validate one vars mapping (a group's ``vars`` or a host's entry); known keys get typed values."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise src.error(where, f"expected a mapping of variables, got {_show(raw)}")
    out: dict[str, object] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise src.error(where, f"variable names must be strings, got {_show(key)}")
        _no_control(key, src, where, "variable name")
        if key in _PASSWORD_KEYS:
            raise src.error(where, key, _NO_PASSWORDS)
        ours = key in _KEYS or key in _EXTRA_KEYS
        _no_control(value, src, where, key, pattern=_CONTROL if ours else _CONTROL_BUT_LAYOUT)
        if key in _KEYS:
            try:
                out[key] = _KEYS[key][1](value, src)
            except _Bad as bad:
                raise src.error(where, key, str(bad)) from None
        elif key in _EXTRA_KEYS:
            try:
                out[key] = _EXTRA_KEYS[key](value, src)
            except _Bad as bad:
                raise src.error(where, key, str(bad)) from None
        elif key.startswith("san_"):  # our namespace: a typo here must not be silently ignored
            close = difflib.get_close_matches(key, _SAN_KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise src.error(where, key, f"unknown key{hint}; known san_ keys: {', '.join(_SAN_KEYS)}")
        elif key.startswith("ansible_") and (why := _ansible_key(key)) is not None:
            raise src.error(where, key, why)
        else:
            out[key] = value
    return out


def _check_host_name(name: str, src: _Source) -> None:
    if not _HOST_NAME.fullmatch(name):
        raise src.error(f"host {_show(name)}", f"not a usable host name ({_HOST_RULE})")


def _make_host(name: str, variables: Mapping[str, object], groups: tuple[str, ...]) -> HostConfig:
    fields: dict[str, Any] = {}
    extra: dict[str, object] = {}
    for key, value in variables.items():
        if key in _KEYS:
            fields[_KEYS[key][0]] = value
        else:
            extra[key] = value
    return HostConfig(name=name, host=fields.pop("host", name), groups=groups, extra=extra, **fields)


# --- the YAML tree ---------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: PyYAML would silently keep the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
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


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_GROUP_SECTIONS = ("hosts", "vars", "children")


class _Reader:
    """Walks the group tree once, collecting vars, edges and hosts in file order."""

    def __init__(self, src: _Source) -> None:
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
            raise self.src.error(where, f"expected a mapping with hosts, vars or children, got {_show(body)}")
        for section in body:
            if section not in _GROUP_SECTIONS:
                raise self.src.error(
                    where, f"unknown section {_show(section)}; expected {', '.join(_GROUP_SECTIONS)}"
                )
        self.group_vars[name].update(_parse_vars(body.get("vars"), self.src, f"{where}: vars"))
        for host, host_body in self._entries(body.get("hosts"), where, "hosts", "host names"):
            if re.search(r"\[.*:.*\]", host):  # Ansible's node[1:3] ranges would otherwise be a hostname
                raise self.src.error(f"host {host!r}", "host ranges are not supported; list each host")
            _check_host_name(host, self.src)
            variables = _parse_vars(host_body, self.src, f"host {host!r}")
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
            raise self.src.error(where, f"{section}: expected a mapping of {what}, got {_show(raw)}")
        for key in raw:
            if not isinstance(key, str) or not key:
                raise self.src.error(where, f"{section}: {what} must be non-empty strings, got {_show(key)}")
            _no_control(key, self.src, where, section)
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
            hosts[host] = _make_host(host, variables, tuple(g for g in mine if g != "all"))
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
    path = Path(path)
    src = _Source(str(path), path.absolute().parent, check_files)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise src.error("inventory file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise src.error(f"cannot read inventory: {exc}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except RecursionError:
        raise src.error("YAML error: nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise src.error(f"{where}YAML error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise src.error(f"YAML error: {exc}") from None
    if not isinstance(data, dict):
        raise src.error(f"expected a mapping with an 'all' group at the top level, got {_show(data)}")
    if "all" not in data:
        raise src.error(f"no 'all' group at the top level (found {', '.join(map(_show, data))})")
    others = [k for k in data if k != "all"]
    if others:  # Ansible would accept these as children of all; we ask for one explicit tree
        raise src.error(f"unexpected top-level key {_show(others[0])}; put groups under all: children:")
    reader = _Reader(src)
    try:
        reader.group("all", data["all"])
        return reader.inventory(path)
    except RecursionError:
        raise src.error("groups nested too deeply") from None


# --- host strings ----------------------------------------------------------------------------------

# query parameter -> inventory key; the parameters are HostConfig's field names
_QUERY_KEYS = {
    "engine": "san_engine",
    "device": "san_device",
    "netdev": "san_netdev",
    "gid_index": "san_gid_index",
    "loopback": "san_loopback",
    "known_hosts": "san_known_hosts",
    "key_file": "ansible_ssh_private_key_file",
    "python_interpreter": "ansible_python_interpreter",
}


def parse_host_string(spec: str, *, check_files: bool = True) -> HostConfig:
    """``[ssh://][user@]host[:port][?k=v&...]`` or ``local://[?k=v&...]`` -> a validated host.

    Query keys are HostConfig field names (engine, device, netdev, gid_index, loopback, known_hosts,
    key_file, python_interpreter); relative paths resolve against the current directory.
    """
    src = _Source(f"host string {spec!r}", Path.cwd(), check_files)
    try:
        parts = urlsplit(spec if "://" in spec else f"ssh://{spec}")
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise src.error(str(exc)) from None
    if parts.scheme not in ("ssh", "local"):
        raise src.error(f"expected ssh:// or local://, got {parts.scheme!r}://")
    if parts.path not in ("", "/") or parts.fragment:
        raise src.error("unexpected path or fragment; options go after '?'")
    raw: dict[str, object] = {"ansible_connection": parts.scheme}
    if parts.scheme == "local":
        if parts.netloc:
            raise src.error(f"local:// takes no host, got {parts.netloc!r}")
        name = "localhost"
    else:
        userinfo, _, hostport = parts.netloc.rpartition("@")
        if ":" in userinfo:
            raise src.error(_NO_PASSWORDS)
        name, port = _split_host_port(hostport, src)
        raw["ansible_host"] = name
        if userinfo:
            raw["ansible_user"] = unquote(userinfo)
        if port is not None:
            raw["ansible_port"] = port
    for param, value in parse_qsl(parts.query, keep_blank_values=True):
        key = _QUERY_KEYS.get(param)
        if key is None:
            raise src.error(f"unknown option {param!r}; known: {', '.join(_QUERY_KEYS)}")
        if key in raw:
            raise src.error(f"option {param!r} given twice")
        raw[key] = value
    return _make_host(name, _parse_vars(raw, src, f"host {name!r}"), ())


def _split_host_port(hostport: str, src: _Source) -> tuple[str, str | None]:
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise src.error(f"cannot read host and port from {hostport!r}")
        port = rest[1:] if rest else None
    elif hostport.count(":") > 1:
        raise src.error(f"write an IPv6 address in brackets: [{hostport}]")
    else:
        host, colon, port_text = hostport.partition(":")
        port = port_text if colon else None
    if not host:
        raise src.error("no host name")
    _check_host_name(host, src)
    return host, port
