"""Ansible INI inventories: the same lab as YAML, Ansible's value rules, the form told apart, every error."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

import hil.inventory
from hil.inventory import InventoryError, load_inventory


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def fails(path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory(path, check_files=False)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


# --- one lab, three forms --------------------------------------------------------------------------

LAB_YAML = """
all:
  vars:
    ansible_user: root
    ansible_python_interpreter: /usr/bin/env python3
  hosts:
    ctl: {ansible_connection: local, san_engine: emulator, san_loopback: true}
  children:
    lab:
      vars: {san_device: rxe0, rack: r4}
      children:
        san:
          vars: {san_gid_index: 1, san_engine: verbs}
          hosts:
            node1: {ansible_host: 127.0.0.1, ansible_port: 10022}
            node2: {ansible_host: 127.0.0.1, ansible_port: 10023, san_device: siw0}
"""

LAB_INI = """
# hosts before any section are in "all"
ctl ansible_connection=local san_engine=emulator san_loopback=True

[san]
node1 ansible_host=127.0.0.1 ansible_port=10022
node2:10023 ansible_host=127.0.0.1 san_device=siw0   # a port after the name is ansible_port

[san:vars]
san_gid_index=1
san_engine = verbs

[lab:children]
san

[lab:vars]
san_device=rxe0
rack=r4

[all:vars]
ansible_user=root
ansible_python_interpreter=/usr/bin/env python3
"""

# The same lab with every variable in group_vars/ and host_vars/ (files, a directory, no extension, JSON).
LAB_INI_BARE = """
ctl
[san]
node1 ansible_host=127.0.0.1
node2 ansible_host=127.0.0.1
[lab:children]
san
"""
VARS_FILES = {
    "group_vars/all.yml": "ansible_user: root\nansible_python_interpreter: /usr/bin/env python3\n",
    "group_vars/lab.yaml": "san_device: rxe0\nrack: r4\n",
    "group_vars/san/10-rdma.yml": "san_gid_index: 1\nsan_engine: emulator\n",
    "group_vars/san/20-engine.yml": "san_engine: verbs  # a later file beats an earlier one\n",
    "host_vars/ctl": "ansible_connection: local\nsan_engine: emulator\nsan_loopback: true\n",
    "host_vars/node1.json": '{"ansible_port": 10022}\n',
    "host_vars/node2.yml": "ansible_port: 10023\nsan_device: siw0\n",
}
LAB_YAML_BARE = """
all:
  hosts: {ctl: }
  children:
    lab:
      children:
        san:
          hosts:
            node1: {ansible_host: 127.0.0.1}
            node2: {ansible_host: 127.0.0.1}
"""


def _lab(tmp_path: Path, form: str) -> Path:
    if form == "yaml":
        return write(tmp_path / "lab.yaml", LAB_YAML)
    if form == "ini":
        return write(tmp_path / "lab.ini", LAB_INI)
    for name, text in VARS_FILES.items():
        write(tmp_path / name, text)
    return write(tmp_path / "hosts", LAB_INI_BARE) if form == "ini+dirs" else write(tmp_path / "lab.yml", LAB_YAML_BARE)


@pytest.mark.parametrize("form", ["ini", "ini+dirs", "yaml+dirs"])
def test_the_same_lab_in_every_form_is_the_same_hosts(tmp_path: Path, form: str) -> None:
    expected = load_inventory(_lab(tmp_path / "yaml", "yaml"))
    inventory = load_inventory(_lab(tmp_path / form, form))
    assert inventory.hosts == expected.hosts
    assert [h.extra for h in inventory.hosts.values()] == [h.extra for h in expected.hosts.values()]
    assert inventory.groups == expected.groups == {
        "all": ("ctl", "node1", "node2"), "lab": ("node1", "node2"), "san": ("node1", "node2")}
    node2 = inventory.hosts["node2"]
    assert (node2.port, node2.device, node2.engine, node2.gid_index, node2.user) == (10023, "siw0", "verbs", 1, "root")
    assert node2.groups == ("lab", "san") and node2.python_argv == ["/usr/bin/env", "python3"]
    assert inventory.hosts["ctl"].engine == "emulator" and inventory.hosts["ctl"].groups == ()


# --- Ansible's value rules -------------------------------------------------------------------------


def test_host_line_values_are_python_literals_after_shell_like_splitting(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.ini", """
        [san]
        n1 a=22 b='22' c="x y" d=True e=yes f=[1,'2'] g="'03#x'" i=None j=(1,2) k="b'x'" l=1e3 m="{'k':1}" h=1#c x=1
        """)
    extra = load_inventory(path).hosts["n1"].extra  # the shell-like split removed the quotes: b and f are numbers
    assert extra == {"a": 22, "b": 22, "c": "x y", "d": True, "e": "yes", "f": [1, 2], "g": "03#x", "h": 1,
                     "i": None, "j": [1, 2], "k": "x", "l": 1000.0, "m": {"k": 1}}


def test_vars_values_are_the_rest_of_the_line_then_python_literals(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.ini", """
        [san]
        n1
        [san:vars]
        a=22
        b='22'
        c = hello world
        d=True
        e=yes
        f=1 # a Python comment ends a literal
        g=rxe0 # but is part of a word
        h="x y"
        i=a=b
        j=
        """)
    extra = load_inventory(path).hosts["n1"].extra
    assert extra == {"a": 22, "b": "22", "c": "hello world", "d": True, "e": "yes", "f": 1,
                     "g": "rxe0 # but is part of a word", "h": "x y", "i": "a=b", "j": ""}


def test_typed_keys_take_ansible_spellings_in_both_places(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.ini", """
        [san]
        n1 ansible_port="2222" san_loopback=yes san_gid_index=0
        n2 san_loopback=false
        [san:vars]
        san_loopback=True
        ansible_port=22
        ansible_python_interpreter="/usr/bin/env python3"
        """)
    n1, n2 = load_inventory(path).select()
    assert (n1.port, n1.loopback, n1.gid_index, n2.port, n2.loopback) == (2222, True, 0, 22, False)
    assert n1.python_argv == ["/usr/bin/env", "python3"]


def test_sections_and_hosts_as_ansible_reads_them(tmp_path: Path) -> None:
    path = write(tmp_path / "hosts", """
        ; a comment
        top
        [web]   # a comment after a header
        w1
        [db]
        d1
        w1
        [prod:children]
        web
        db   # comment
        [all]
        extra1
        [six]
        [::1]:2200 ansible_user=six
        fe80::1%eth0
        """)
    inventory = load_inventory(path)
    assert inventory.groups == {"all": ("top", "w1", "d1", "extra1", "::1", "fe80::1%eth0"), "web": ("w1",),
                                "db": ("w1", "d1"), "prod": ("w1", "d1"), "six": ("::1", "fe80::1%eth0")}
    assert inventory.hosts["w1"].groups == ("prod", "db", "web")  # prod at depth 1, its children db, web at 2
    six = inventory.hosts["::1"]
    assert (six.host, six.port, six.user) == ("::1", 2200, "six")


def test_a_host_listed_twice_keeps_its_variables_later_lines_winning(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.ini", "[a]\nn1 x=1 y=1\n[b]\nn1 y=2\n[a:children]\nc\n[c]\nn1:2222\n")
    host = load_inventory(path).hosts["n1"]
    assert (host.extra, host.port, host.groups) == ({"x": 1, "y": 2}, 2222, ("a", "b", "c"))


def test_inline_vars_beat_the_port_after_the_name(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.ini", "[san]\nn1:2222 ansible_port=3333\n")
    assert load_inventory(path).hosts["n1"].port == 3333


# --- which form ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lab.ini", "lab.cfg", "hosts", "lab.txt", "lab.yaml", "lab.yml"])
def test_an_ini_inventory_is_read_by_its_suffix_or_its_first_section(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, "# comment\n\n[san]\nn1 san_engine=emulator\n")
    assert load_inventory(path).hosts["n1"].engine == "emulator"


@pytest.mark.parametrize("name", ["lab.ini", "hosts", "lab.txt"])
def test_host_lines_without_a_section_are_ini(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, "n1 ansible_port=2222\nn2\n")
    assert [(h.name, h.port) for h in load_inventory(path).hosts.values()] == [("n1", 2222), ("n2", 22)]


@pytest.mark.parametrize("name", ["hosts", "lab.txt", "lab.json"])
def test_a_yaml_mapping_without_a_yaml_suffix_is_yaml(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, '{"all": {"hosts": {"n1": {"ansible_port": 2222}}}}\n')
    assert load_inventory(path).hosts["n1"].port == 2222


def test_a_file_that_is_neither_says_why_it_is_neither(tmp_path: Path) -> None:
    path = write(tmp_path / "hosts", "all:\n  hosts:\n\tn1:\n")
    assert fails(path) == (
        f"{path}: neither a YAML inventory (line 3, column 1: YAML error: found character '\\t' that cannot start "
        "any token) nor an INI one (line 1: 'all:': expected host:port with a port number, got 'all:')")
    path = write(tmp_path / "list", "- n1\n- n2\n")
    assert fails(path) == (
        f"{path}: neither a YAML inventory (expected a mapping with an 'all' group at the top level, got "
        "['n1', 'n2']) nor an INI one (line 1: '- n1': host '-': not a usable host name (letters, digits, '.', '_', "
        "'-', ':' or '%', not starting with '-' or '.'))")


def test_a_yaml_suffix_still_means_yaml_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.yaml", "all:\n  hosts:\n    n1: {san_device: rxe0\n")
    assert "YAML error" in fails(path)
    path = write(tmp_path / "lab.ini", "all:\n  hosts:\n")
    assert fails(path) == f"{path}: line 1: 'all:': expected host:port with a port number, got 'all:'"


def test_an_empty_ini_inventory_has_no_hosts(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path / "lab.ini", "# nothing yet\n"))
    assert (inventory.hosts, inventory.groups) == ({}, {"all": ()})
    with pytest.raises(InventoryError, match="group 'san' does not exist"):
        inventory.select()


# --- errors: each names the file, the line and the line's text ---------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[san:var]\n", "line 1: '[san:var]': unknown section kind 'var'; expected hosts, vars, children"),
        ("[san ]\n", "line 1: '[san ]': not a section header: write [group], [group:vars] or [group:children], "
                     "without blanks"),
        ("[::1]\n", "line 1: '[::1]': not a section header: write [group], [group:vars] or [group:children], "
                    "without blanks"),
        ("[san]\nn1 ansible_port\n", "line 2: 'n1 ansible_port': expected key=value after the host name, got "
                                     "'ansible_port'"),
        ("[san]\nn1 =x\n", "line 2: 'n1 =x': expected key=value after the host name, got '=x'"),
        ("[san]\nn1 x='open\n", "line 2: \"n1 x='open\": cannot split the line into words: No closing quotation"),
        ("[san]\nnode[1:3] ansible_user=root\n", "line 2: 'node[1:3] ansible_user=root': host ranges (node[1:3]) "
                                                 "are not supported; list each host"),
        ("[san]\nn1:ssh\n", "line 2: 'n1:ssh': expected host:port with a port number, got 'n1:ssh'"),
        ("[san]\nn1:\n", "line 2: 'n1:': expected host:port with a port number, got 'n1:'"),
        ("[san]\n-oProxyCommand=x\n", "line 2: '-oProxyCommand=x': host '-oProxyCommand=x': not a usable host name "
                                      "(letters, digits, '.', '_', '-', ':' or '%', not starting with '-' or '.')"),
        ("[san]\nn1 a=1 a=2\n", "line 2: 'n1 a=1 a=2': a given twice"),
        ("[san]\nn1 x={[1]}\n", "line 2: 'n1 x={[1]}': cannot read the value '{[1]}': TypeError: unhashable type: "
                                "'list'"),
        ("[san]\n[san:vars]\nsan_device\n", "line 3: 'san_device': expected key=value"),
        ("[san]\n[san:vars]\n= rxe0\n", "line 3: '= rxe0': expected key=value"),
        ("[san]\n[san:vars]\na=1\n[san:vars]\na=2\n", "line 5: 'a=2': a is already set for group 'san' on line 3"),
        ("[lab:children]\nsan rxe\n", "line 2: 'san rxe': expected a group name"),
        ("[lab:children]\nsan\n[rxe]\n", "line 2: 'san': group 'san' (in [lab:children]) is never declared: add a "
                                         "[san] section"),
        ("[gpu:vars]  # the lab's GPUs\nx=1\n", "line 1: \"[gpu:vars]  # the lab's GPUs\": group 'gpu' is never "
                                                "declared: add a [gpu] section"),
        ("[a]\n[b]\n[a:children]\nb\n[b:children]\na\n", "group cycle: a -> b -> a (line 6: 'a')"),
        ("[a:children]\na\n", "group cycle: a -> a (line 2: 'a')"),
        ("[a:children]\nall\n", "group cycle: all -> a -> all (line 2: 'all')"),
    ],
)
def test_structure_errors_name_the_line(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path / "lab.ini", text)
    assert fails(path) == f"{path}: {expected}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[san]\nn1 san_engine=verb\n", "line 2: host 'n1': san_engine: expected one of 'verbs', 'emulator', got "
                                        "'verb'"),
        ("[san]\nn1 ansible_port=0\n", "line 2: host 'n1': ansible_port: expected an integer 1-65535, got 0"),
        ("[san]\nn1:0\n", "line 2: host 'n1': ansible_port: expected an integer 1-65535, got 0"),
        ("[san]\nn1 san_device=0\n", "line 2: host 'n1': san_device: expected a non-empty string, got 0"),
        ("[san]\nn1 ansible_password=x\n", "line 2: host 'n1': ansible_password: passwords are not accepted; use "
                                           "SSH keys or ssh-agent"),
        ("[san]\nn1 ansible_ssh_host=x\n", "line 2: host 'n1': ansible_ssh_host: Ansible's other name for "
                                           "ansible_host; write that (pytest-san reads only that name)"),
        ("[san]\nn1 ansible_host=-x\n", "line 2: host 'n1': ansible_host: not a host name or address (letters, "
                                        "digits, '.', '_', '-', ':' or '%', not starting with '-' or '.'): '-x'"),
        ("[san]\n[san:vars]\nsan_gid_index=one\n", "line 3: group 'san': vars: san_gid_index: expected an integer "
                                                   ">= 0, got 'one'"),
        ("[all:vars]\nansible_python_interpreter=auto\n", "line 2: group 'all': vars: ansible_python_interpreter: "
                                                          "Ansible's interpreter discovery ('auto') is not supported: "
                                                          "give the interpreter, e.g. /usr/bin/python3"),
        ("[san]\nn1 x=\"'\\x00'\"\n", "line 2: host 'n1': x: control character '\\x00' in '\\x00'; remove it"),
        ("[s\x01an]\n", "line 1: group name: control character '\\x01' in 's\\x01an'; remove it"),
        ("[a:children]\nb\x1b\n[b\x1b]\n", "line 2: group name: control character '\\x1b' in 'b\\x1b'; remove it"),
        ("[san]\nn1 x\x00y=1\n", "line 2: host 'n1': variable name: control character '\\x00' in 'x\\x00y'; "
                                 "remove it"),
    ],
)
def test_value_errors_name_the_line_host_or_group_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path / "lab.ini", text)
    assert fails(path) == f"{path}: {expected}"


def test_an_unknown_san_key_in_vars_is_a_typo_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.ini", "[san]\nn1\n[san:vars]\nsan_enigne=verbs\n")
    assert fails(path).startswith(f"{path}: line 4: group 'san': vars: san_enigne: unknown key (did you mean "
                                  "san_engine?)")


def test_an_unreadable_inventory(tmp_path: Path) -> None:
    path = tmp_path / "lab.ini"
    path.write_bytes(b"[san]\nn\xff1\n")
    assert fails(path).startswith(f"{path}: cannot read inventory: 'utf-8' codec can't decode byte 0xff")
    path = tmp_path / "dir.ini"
    path.mkdir()
    assert fails(path).startswith(f"{path}: cannot read inventory: [Errno 21] Is a directory")


def test_nesting_too_deep_is_an_inventory_error(tmp_path: Path) -> None:
    chain = "".join(f"[g{i}:children]\ng{i + 1}\n" for i in range(3000)) + "[g3000]\nn1\n"
    assert fails(write(tmp_path / "lab.ini", chain)).endswith("groups nested too deeply")
    assert load_inventory(write(tmp_path / "ok.ini", "[san]\nn1 x=" + "[" * 300 + "]" * 300 + "\n")).hosts["n1"]


# --- the shipped example -----------------------------------------------------------------------------

EXAMPLES = Path(hil.inventory.__file__).resolve().with_name("examples")  # shipped as package data


def test_the_ini_example_is_lab_yaml_with_its_vars_in_group_vars() -> None:
    ini = load_inventory(EXAMPLES / "ini" / "lab.ini", check_files=False)
    lab = load_inventory(EXAMPLES / "lab.yaml", check_files=False)
    keys = EXAMPLES / "ini" / ".lab"  # beside lab.ini, as .lab/ is beside lab.yaml
    assert list(ini.hosts.values()) == [replace(host, key_file=keys / "id_ed25519", known_hosts=keys / "known_hosts")
                                        for host in lab.hosts.values()]
    assert ini.groups == lab.groups == {"all": ("node1", "node2"), "san": ("node1", "node2")}
