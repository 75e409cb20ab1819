"""The inventory reader under arbitrary input: every bad inventory is an InventoryError naming the file.

Never a raw KeyError, TypeError, AttributeError, RecursionError...: whatever the YAML, the INI or a
group_vars/host_vars file holds, where it holds it. What loads is sane: host names are host names, no value
holds a NUL, the interpreter splits.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
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


def _load(content: str, name: str = "lab.yaml",
          files: dict[str, str] | None = None) -> tuple[list[Path], Inventory | InventoryError]:
    """Load ``content`` as ``name`` with ``files`` (relative path -> text) beside it; the paths written, the
    inventory first, and what loading gave."""
    directory = Path(tempfile.mkdtemp(prefix="san-inv-fuzz-"))
    written = []
    try:
        for path_name, text in {name: content, **(files or {})}.items():
            path = directory / path_name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
        try:
            return written, load_inventory(written[0], check_files=False)
        except InventoryError as exc:
            return written, exc
    finally:
        shutil.rmtree(directory)


def _check(paths: list[Path], result: Inventory | InventoryError) -> None:
    if isinstance(result, InventoryError):
        assert any(str(result).startswith(f"{path}: ") for path in paths), result
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


# --- INI inventories and vars files ------------------------------------------------------------------

INI_LINES = ["[san]", "[san:vars]", "[san:children]", "[all:vars]", "[lab:children]", "[lab]", "[san:var]", "[a b]",
             "[::1]", "[::1]:22 x=1", "n1", "n1:22", "n1:x", "n1:", "node[1:3]", "-x", "n1 ansible_port=2222",
             "n1 ansible_port='22'", "n1 san_loopback=yes san_engine=emulator", "n1 x=\"'\\x00'\"", "n1 x='open",
             "n1 x={[1]}", "n1 x=[[[[]]]] y=1e999", "n1 a=1 a=2", "n1 =x", "n1 ansible_password=x", "san", "all",
             "lab", "san_device=rxe0", "san_gid_index=one", "x = 1 # c", "=x", "ansible_python_interpreter=auto",
             "# comment", "; comment", "", "  ", "\ufeff[san]", "n\x001", "[s\x01]", "---", "all:", "  hosts:",
             "n1 x=" + "[" * 250 + "]" * 250, "n1 x=" + "9" * 5000]
ini_lines = st.lists(st.sampled_from(INI_LINES) | st.text(utf8, max_size=20), max_size=12).map("\n".join)


@settings(max_examples=EXAMPLES, deadline=None)
@given(ini_lines, st.sampled_from(["lab.ini", "hosts", "lab.yaml"]))
def test_ini_line_soup_loads_or_is_an_inventory_error(content: str, name: str) -> None:
    _check(*_load(content, name))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.text(utf8, max_size=200), st.sampled_from(["lab.ini", "hosts"]))
def test_any_text_as_ini_loads_or_is_an_inventory_error(content: str, name: str) -> None:
    _check(*_load(content, name))


VARS_FILES = ["group_vars/all.yml", "group_vars/san", "group_vars/san.yaml", "group_vars/san/a.yml",
              "group_vars/san/b", "group_vars/lab.json", "host_vars/n1.yml", "host_vars/n1/x.yml", "host_vars/n2"]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(VARS_FILES),
                       st.builds(lambda d: yaml.safe_dump(d, allow_unicode=True), values) | st.text(utf8, max_size=60),
                       max_size=3))
def test_any_vars_files_load_or_are_an_inventory_error(files: dict[str, str]) -> None:
    if "group_vars/san" in files and any(name.startswith("group_vars/san/") for name in files):
        del files["group_vars/san"]  # a file and a directory of one name cannot both be written
    _check(*_load("[san]\nn1\n[lab:children]\nsan\n[lab]\nn2\n", "lab.ini", files))
