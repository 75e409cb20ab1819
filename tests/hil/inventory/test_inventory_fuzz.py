"""The inventory reader under arbitrary input: every bad inventory is an InventoryError naming the file.

Never a raw KeyError, TypeError, AttributeError, RecursionError...: whatever the YAML holds, where it
holds it. What loads is sane: host names are host names, no value holds a NUL, the interpreter splits.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hil.inventory import Inventory, InventoryError, load_inventory, parse_host_string

EXAMPLES = int(os.environ.get("SAN_FUZZ_EXAMPLES", "300"))  # more for a longer hunt

KEYS = [
    "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file", "ansible_python_interpreter",
    "ansible_connection", "ansible_ssh_host", "ansible_become", "ansible_prot", "ansible_perl_interpreter",
    "ansible_password", "san_engine", "san_device", "san_netdev", "san_gid_index", "san_loopback",
    "san_known_hosts", "san_remote_tmp", "san_lab_address", "san_enigne", "notes",
]
WORDS = ["all", "hosts", "vars", "children", "san", "n1", "-x", "~nobody-xyz/k", "auto", "/usr/bin/env python3",
         "'", "verbs", "emulator", "local", "ssh", "yes", "0", "22", "", " ", "a\0b", "\x1b", "x" * 300, "n[1:3]"]

utf8 = st.characters(exclude_categories=["Cs"])  # no lone surrogates: they are not UTF-8
text = st.text(utf8, max_size=12)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text | st.sampled_from(WORDS)
keys = st.sampled_from(KEYS + WORDS) | text | st.integers() | st.booleans() | st.none()
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(keys, kids, max_size=3),
                      max_leaves=12)


@st.composite
def group(draw: st.DrawFn, depth: int = 0) -> Any:
    """A group body: mostly the right shape, with anything anywhere now and then."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    body: dict[Any, Any] = {}
    if draw(st.booleans()):
        body["vars"] = draw(st.dictionaries(keys, values, max_size=4) | values)
    if draw(st.booleans()):
        body["hosts"] = draw(st.dictionaries(st.sampled_from(WORDS) | text | st.integers(),
                                             st.dictionaries(keys, values, max_size=4) | values, max_size=3))
    if depth < 2 and draw(st.booleans()):
        body["children"] = draw(st.dictionaries(st.sampled_from(WORDS) | text, group(depth + 1), max_size=3))
    if draw(st.integers(0, 9)) == 0:
        body[draw(keys)] = draw(values)
    return body


documents = st.builds(lambda g: {"all": g}, group()) | st.dictionaries(keys, values, max_size=2) | values


def _load(content: str) -> tuple[Path, Inventory | InventoryError]:
    directory = Path(tempfile.mkdtemp(prefix="san-inv-fuzz-"))
    path = directory / "lab.yaml"
    path.write_text(content, encoding="utf-8")
    try:
        return path, load_inventory(path, check_files=False)
    except InventoryError as exc:
        return path, exc
    finally:
        path.unlink()
        directory.rmdir()


def _check(path: Path, result: Inventory | InventoryError) -> None:
    if isinstance(result, InventoryError):
        assert str(result).startswith(f"{path}: "), result
        return
    for host in result.hosts.values():
        assert re.fullmatch(r"[A-Za-z0-9_:][A-Za-z0-9._:%-]*", host.name), host.name
        assert "\0" not in repr(host) and host.python_argv and not host.python_argv[0].startswith("-")
        assert shlex.split(host.python_interpreter) == host.python_argv


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_any_yaml_structure_loads_or_is_an_inventory_error(document: Any) -> None:
    _check(*_load(yaml.safe_dump(document, allow_unicode=True)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.text(utf8, max_size=200))
def test_any_text_loads_or_is_an_inventory_error(content: str) -> None:
    _check(*_load(content))


LINES = ["all:", "  hosts:", "  vars:", "  children:", "    n1:", "    san:", "      hosts:",
         "        n2: {ansible_port: x}", "    - a", "  ? [a]", "  : 1", "&a [*a]", "<<: *a",
         "    n3: {san_loopback: yes, ansible_host: -x}", "!!set {a}", "{", "'", '"\\0"']


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.sampled_from(LINES)).map("\n".join))
def test_line_soup_loads_or_is_an_inventory_error(content: str) -> None:
    _check(*_load(content))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.text(utf8, max_size=60)
       | st.builds("{}://{}?{}={}".format, st.sampled_from(["ssh", "local", "http"]), text,
                   st.sampled_from(["engine", "device", "gid_index", "loopback", "python_interpreter", "key_file"]),
                   text))
def test_any_host_string_parses_or_is_an_inventory_error(spec: str) -> None:
    try:
        host = parse_host_string(spec, check_files=False)
    except InventoryError as exc:
        assert str(exc).startswith(f"host string {spec!r}: "), exc
        return
    assert "\0" not in repr(host) and host.python_argv
