"""The lab inventory reader: inheritance, precedence, defaults, paths, host strings and every error."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

import hil.inventory
from hil.inventory import HostConfig, InventoryError, load_inventory, parse_host_string

EXAMPLES = Path(hil.inventory.__file__).resolve().with_name("examples")  # shipped as package data


def write(tmp_path: Path, text: str, name: str = "lab.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def fails(path: Path, *, check_files: bool = True) -> str:
    """The message of the InventoryError loading ``path`` raises; it must start with the file."""
    with pytest.raises(InventoryError) as info:
        load_inventory(path, check_files=check_files)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return message


# --- the shipped inventories -----------------------------------------------------------------------


def test_lab_inventory_describes_two_soft_roce_guests() -> None:
    inventory = load_inventory(EXAMPLES / "lab.yaml", check_files=False)
    node1, node2 = inventory.select()
    assert (node1.host, node1.port, node2.host, node2.port) == ("127.0.0.1", 10022, "127.0.0.1", 10023)
    for node in (node1, node2):
        assert (node.user, node.engine, node.device, node.gid_index) == ("root", "verbs", "rxe0", 1)
        assert node.key_file is not None and node.key_file.parent == EXAMPLES / ".lab"
        assert node.known_hosts == EXAMPLES / ".lab" / "known_hosts"


def test_local_inventory_is_one_local_emulator_loopback_host() -> None:
    (host,) = load_inventory(EXAMPLES / "local.yaml").select()
    assert (host.connection, host.engine, host.loopback) == ("local", "emulator", True)


# --- inheritance and precedence --------------------------------------------------------------------


def test_vars_are_inherited_from_all_through_children_and_grandchildren(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        all:
          vars: {ansible_user: root}
          children:
            san:
              vars: {san_engine: emulator}
              children:
                rxe:
                  vars: {san_device: rxe0}
                  hosts:
                    n1: {san_gid_index: 1}
        """,
    )
    host = load_inventory(path).hosts["n1"]
    assert (host.user, host.engine, host.device, host.gid_index) == ("root", "emulator", "rxe0", 1)
    assert host.groups == ("san", "rxe")


def test_host_beats_deeper_group_beats_shallower_group(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        all:
          vars: {san_device: all, san_netdev: all, ansible_user: all, ansible_port: 1}
          children:
            san:
              vars: {san_device: san, san_netdev: san, ansible_user: san}
              children:
                rxe:
                  vars: {san_device: rxe, san_netdev: rxe}
                  hosts:
                    n1: {san_device: host}
        """,
    )
    host = load_inventory(path).hosts["n1"]
    assert (host.device, host.netdev, host.user, host.port) == ("host", "rxe", "san", 1)


def test_depth_not_file_order_decides_and_same_depth_goes_by_name(tmp_path: Path) -> None:
    # "deep" is defined first but nested under "mid"; "b" beats "a" at equal depth although listed first.
    path = write(
        tmp_path,
        """
        all:
          children:
            deep:
              vars: {san_device: deep}
              hosts: {n1: }
            b:
              vars: {san_netdev: b}
              hosts: {n1: }
            a:
              vars: {san_netdev: a}
              hosts: {n1: }
            mid:
              vars: {san_device: mid}
              children: {deep: }
        """,
    )
    host = load_inventory(path).hosts["n1"]
    assert (host.device, host.netdev) == ("deep", "b")
    assert host.groups == ("a", "b", "mid", "deep")


def test_host_in_several_groups_is_one_host_in_all_of_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        all:
          children:
            san:
              hosts:
                n1: {san_device: rxe0}
                n2:
            spare:
              vars: {san_engine: emulator}
              hosts:
                n1: {san_gid_index: 3}
        """,
    )
    inventory = load_inventory(path)
    assert list(inventory.hosts) == ["n1", "n2"]
    n1 = inventory.hosts["n1"]
    assert (n1.device, n1.gid_index, n1.engine, n1.groups) == ("rxe0", 3, "emulator", ("san", "spare"))
    assert inventory.groups == {"all": ("n1", "n2"), "san": ("n1", "n2"), "spare": ("n1",)}


def test_group_membership_includes_nested_groups_and_references_by_name(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        all:
          hosts: {top: }
          children:
            san:
              hosts: {n1: }
              children:
                guests: {hosts: {n2: }}
                spare:
            spare:
              hosts: {n3: }
        """,
    )
    inventory = load_inventory(path)
    assert inventory.groups["san"] == ("n1", "n2", "n3")
    assert inventory.groups["all"] == ("top", "n1", "n2", "n3")
    assert inventory.hosts["n3"].groups == ("san", "spare")  # "spare" is deeper: it is a child of san


# --- defaults, extras, paths -----------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    host = load_inventory(write(tmp_path, "all:\n  hosts:\n    node7:\n")).hosts["node7"]
    assert host == HostConfig(name="node7", host="node7", groups=())
    assert (host.port, host.user, host.key_file, host.python_interpreter) == (
        22,
        None,
        None,
        "/usr/bin/python3",
    )
    assert (host.connection, host.engine, host.device, host.netdev) == ("ssh", "verbs", None, None)
    assert (host.gid_index, host.loopback, host.known_hosts, host.extra) == (None, False, None, {})


def test_unknown_ansible_keys_and_other_vars_are_kept_in_extra(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        all:
          vars: {ansible_become: true, rack: 4}
          hosts:
            n1: {ansible_ssh_common_args: -o Foo=bar, notes: [a, b]}
        """,
    )
    host = load_inventory(path).hosts["n1"]
    assert host.extra == {
        "ansible_become": True,
        "rack": 4,
        "ansible_ssh_common_args": "-o Foo=bar",
        "notes": ["a", "b"],
    }


def test_strings_of_digits_and_yaml_booleans_are_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path, "all:\n  hosts:\n    n1: {ansible_port: '2222', san_gid_index: '0', san_loopback: yes}\n"
    )
    host = load_inventory(path).hosts["n1"]
    assert (host.port, host.gid_index, host.loopback) == (2222, 0, True)


def test_relative_paths_resolve_against_the_inventory_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "inv" / ".lab").mkdir(parents=True)
    (tmp_path / "inv" / ".lab" / "id").touch()
    (tmp_path / "inv" / ".lab" / "known_hosts").touch()
    path = write(
        tmp_path / "inv",
        "all:\n  vars: {ansible_ssh_private_key_file: .lab/id, san_known_hosts: .lab/known_hosts}\n"
        "  hosts: {n1: }\n",
    )
    monkeypatch.chdir(tmp_path)  # the working directory must not matter
    host = load_inventory(Path("inv") / "lab.yaml").hosts["n1"]
    assert host.key_file == tmp_path / "inv" / ".lab" / "id"
    assert host.known_hosts == tmp_path / "inv" / ".lab" / "known_hosts"
    assert host.key_file.is_absolute()
    assert load_inventory(path).hosts["n1"] == host


def test_tilde_is_expanded_and_absolute_paths_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "lab").touch()
    (tmp_path / "known").touch()
    path = write(
        tmp_path,
        "all:\n  hosts:\n    n1:\n"
        f"      {{ansible_ssh_private_key_file: ~/.ssh/lab, san_known_hosts: {tmp_path}/known}}\n",
    )
    host = load_inventory(path).hosts["n1"]
    assert host.key_file == tmp_path / "home" / ".ssh" / "lab"
    assert host.known_hosts == tmp_path / "known"


def test_check_files_false_allows_files_that_do_not_exist_yet(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  hosts:\n    n1: {ansible_ssh_private_key_file: .lab/id}\n")
    assert load_inventory(path, check_files=False).hosts["n1"].key_file == tmp_path / ".lab" / "id"


def test_hosts_are_hashable_and_frozen(tmp_path: Path) -> None:
    host = load_inventory(write(tmp_path, "all:\n  hosts:\n    n1: {rack: [1]}\n")).hosts["n1"]
    assert hash(host) == hash(host)
    with pytest.raises(AttributeError):
        host.port = 1  # type: ignore[misc]


# --- errors: the file and its structure ------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    assert fails(tmp_path / "nope.yaml") == f"{tmp_path / 'nope.yaml'}: inventory file not found"


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  hosts:\n    n1: {san_device: rxe0\n    n2:\n")
    message = fails(path)
    assert "line 4" in message and "YAML error" in message


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  hosts:\n    n1: {ansible_port: 1}\n    n1: {ansible_port: 2}\n")
    message = fails(path)
    assert "line 4" in message and "duplicate key 'n1'" in message


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        all:
          hosts:
            n1: &base {san_device: rxe0, ansible_port: 1}
            n2: {<<: *base, ansible_port: 2}
        """,
    )
    n2 = load_inventory(path).hosts["n2"]
    assert (n2.device, n2.port) == ("rxe0", 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "expected a mapping with an 'all' group at the top level, got None"),
        ("- all\n", "expected a mapping with an 'all' group at the top level, got ['all']"),
        ("san:\n  hosts:\n", "no 'all' group at the top level (found 'san')"),
        ("all:\nsan:\n", "unexpected top-level key 'san'; put groups under all: children:"),
        ("all: [n1]\n", "group 'all': expected a mapping with hosts, vars or children, got ['n1']"),
        ("all:\n  host: {n1: }\n", "group 'all': unknown section 'host'; expected hosts, vars, children"),
        ("all:\n  hosts: [n1]\n", "group 'all': hosts: expected a mapping of host names, got ['n1']"),
        (
            "all:\n  children: [san]\n",
            "group 'all': children: expected a mapping of group names, got ['san']",
        ),
        ("all:\n  vars: [a]\n", "group 'all': vars: expected a mapping of variables, got ['a']"),
        ("all:\n  hosts: {n1: [a]}\n", "host 'n1': expected a mapping of variables, got ['a']"),
        ("all:\n  hosts: {1: }\n", "group 'all': hosts: host names must be non-empty strings, got 1"),
        ("all:\n  vars: {1: a}\n", "group 'all': vars: variable names must be strings, got 1"),
        (
            "all:\n  children:\n    san:\n      hosts: {'n[1:3]': }\n",
            "host 'n[1:3]': host ranges are not supported; list each host",
        ),
    ],
)
def test_structure_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert fails(path) == f"{path}: {expected}"


def test_group_cycle_through_references_by_name(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        all:
          children:
            a:
              children: {b: }
            b:
              children: {c: {children: {a: }}}
        """,
    )
    assert fails(path) == f"{path}: group cycle: all -> a -> b -> c -> a"


def test_group_cycle_through_nesting(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  children:\n    a:\n      children:\n        all:\n")
    assert fails(path) == f"{path}: group cycle: all -> a -> all"


# --- errors: values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("ansible_host", "5", "expected a non-empty string, got 5"),
        ("ansible_host", "''", "expected a non-empty string, got ''"),
        ("ansible_port", "0", "expected an integer 1-65535, got 0"),
        ("ansible_port", "65536", "expected an integer 1-65535, got 65536"),
        ("ansible_port", "ssh", "expected an integer 1-65535, got 'ssh'"),
        ("ansible_port", "true", "expected an integer 1-65535, got True"),
        ("ansible_port", "22.5", "expected an integer 1-65535, got 22.5"),
        ("ansible_user", "[root]", "expected a non-empty string, got ['root']"),
        ("ansible_ssh_private_key_file", "7", "expected a non-empty string, got 7"),
        ("ansible_python_interpreter", "null", "expected a non-empty string, got None"),
        ("ansible_connection", "paramiko", "expected one of 'ssh', 'local', got 'paramiko'"),
        ("san_engine", "verb", "expected one of 'verbs', 'emulator', got 'verb'"),
        ("san_engine", "null", "expected one of 'verbs', 'emulator', got None"),
        ("san_device", "0", "expected a non-empty string, got 0"),
        ("san_netdev", "{a: b}", "expected a non-empty string, got {'a': 'b'}"),
        ("san_gid_index", "one", "expected an integer >= 0, got 'one'"),
        ("san_gid_index", "-1", "expected an integer >= 0, got -1"),
        ("san_loopback", "maybe", "expected true or false, got 'maybe'"),
        ("san_loopback", "2", "expected true or false, got 2"),
        ("san_known_hosts", "[a]", "expected a non-empty string, got ['a']"),
    ],
)
def test_typed_keys_reject_bad_values(tmp_path: Path, key: str, value: str, expected: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    node1: {{{key}: {value}}}\n")
    assert fails(path) == f"{path}: host 'node1': {key}: {expected}"


def test_bad_value_in_group_vars_names_the_group(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  children:\n    san:\n      vars: {san_engine: verb}\n")
    assert (
        fails(path)
        == f"{path}: group 'san': vars: san_engine: expected one of 'verbs', 'emulator', got 'verb'"
    )


@pytest.mark.parametrize("key", ["ansible_ssh_private_key_file", "san_known_hosts"])
def test_missing_key_and_known_hosts_files(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    node1: {{{key}: .lab/absent}}\n")
    assert fails(path) == (
        f"{path}: host 'node1': {key}: file not found: '{tmp_path / '.lab' / 'absent'}' (from '.lab/absent')"
    )
    assert load_inventory(path, check_files=False).hosts["node1"]


@pytest.mark.parametrize("key", ["ansible_password", "ansible_ssh_pass", "ansible_become_pass"])
def test_passwords_are_refused(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    node1: {{{key}: hunter2}}\n")
    message = fails(path)
    assert message == f"{path}: host 'node1': {key}: passwords are not accepted; use SSH keys or ssh-agent"
    assert "hunter2" not in message


def test_password_in_group_vars_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  vars: {ansible_password: x}\n  hosts: {n1: }\n")
    assert fails(path).startswith(f"{path}: group 'all': vars: ansible_password: passwords are not accepted")


def test_unknown_san_key_is_a_typo(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  hosts:\n    node1: {san_enigne: verbs}\n")
    assert fails(path) == (
        f"{path}: host 'node1': san_enigne: unknown key (did you mean san_engine?); known san_ keys: "
        "san_console_log, san_device, san_engine, san_gid_index, san_known_hosts, san_lab_address, san_lab_kernel, "
        "san_loopback, san_netdev, san_port, san_remote_tmp"
    )


# --- select ----------------------------------------------------------------------------------------


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        """
        all:
          hosts: {ctl: }
          children:
            san:
              hosts: {n2: , n1: }
              children:
                more: {hosts: {n3: }}
            empty:
        """,
    )


def test_select_defaults_to_group_san_in_file_order(lab: Path) -> None:
    assert [h.name for h in load_inventory(lab).select()] == ["n2", "n1", "n3"]
    assert [h.name for h in load_inventory(lab).select("all")] == ["ctl", "n2", "n1", "n3"]


def test_select_restricts_to_names_keeping_file_order(lab: Path) -> None:
    assert [h.name for h in load_inventory(lab).select(names=["n3", "n2"])] == ["n2", "n3"]


def test_select_unknown_name(lab: Path) -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(lab).select(names=["n1", "ctl"])
    assert str(info.value) == f"{lab}: host 'ctl' is not in group 'san'; its hosts: n2, n1, n3"


@pytest.mark.parametrize(("group", "state"), [("empty", "has no hosts"), ("gpu", "does not exist")])
def test_select_empty_or_missing_group(lab: Path, group: str, state: str) -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(lab).select(group)
    assert str(info.value) == f"{lab}: group {group!r} {state}; groups: all, san, more, empty"


# --- host strings ----------------------------------------------------------------------------------


def test_ssh_host_string() -> None:
    host = parse_host_string("ssh://user@host:2222?engine=emulator&loopback=1")
    assert host == HostConfig(
        name="host", host="host", port=2222, user="user", engine="emulator", loopback=True
    )


def test_host_string_defaults_to_ssh_and_takes_every_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "id").touch()
    (tmp_path / "kh").touch()
    monkeypatch.chdir(tmp_path)
    host = parse_host_string(
        "root@10.0.0.2?device=rxe0&netdev=eth1&gid_index=1&key_file=id&known_hosts=kh"
        "&python_interpreter=/usr/bin/python3.11"
    )
    assert (host.connection, host.host, host.port, host.user) == ("ssh", "10.0.0.2", 22, "root")
    assert (host.device, host.netdev, host.gid_index) == ("rxe0", "eth1", 1)
    assert (host.key_file, host.known_hosts) == (tmp_path / "id", tmp_path / "kh")
    assert host.python_interpreter == "/usr/bin/python3.11"


def test_local_host_string() -> None:
    host = parse_host_string("local://?engine=emulator")
    assert (host.connection, host.engine, host.name, host.loopback) == (
        "local",
        "emulator",
        "localhost",
        False,
    )


def test_ipv6_host_string() -> None:
    host = parse_host_string("ssh://[::1]:10022")
    assert (host.host, host.port) == ("::1", 10022)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("http://host", "expected ssh:// or local://, got 'http'://"),
        ("ssh://user:secret@host", "passwords are not accepted; use SSH keys or ssh-agent"),
        ("ssh://host:port", "host 'host': ansible_port: expected an integer 1-65535, got 'port'"),
        ("ssh://host:0", "host 'host': ansible_port: expected an integer 1-65535, got 0"),
        (
            "ssh://host?engine=verb",
            "host 'host': san_engine: expected one of 'verbs', 'emulator', got 'verb'",
        ),
        ("ssh://host?gid_index=one", "host 'host': san_gid_index: expected an integer >= 0, got 'one'"),
        ("ssh://host?loopback=maybe", "host 'host': san_loopback: expected true or false, got 'maybe'"),
        ("ssh://host?device=", "host 'host': san_device: expected a non-empty string, got ''"),
        ("ssh://host?engine=verbs&engine=emulator", "option 'engine' given twice"),
        ("ssh://host/path", "unexpected path or fragment; options go after '?'"),
        ("ssh://", "no host name"),
        ("ssh://::1", "write an IPv6 address in brackets: [::1]"),
        ("local://box", "local:// takes no host, got 'box'"),
    ],
)
def test_host_string_errors(spec: str, expected: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_host_string(spec)
    assert str(info.value) == f"host string {spec!r}: {expected}"


def test_host_string_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(InventoryError, match=r"unknown option 'engin'; known: engine, device, netdev"):
        parse_host_string("ssh://host?engin=verbs")


def test_host_string_missing_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError) as info:
        parse_host_string("ssh://host?key_file=absent")
    assert str(info.value) == (
        f"host string 'ssh://host?key_file=absent': host 'host': ansible_ssh_private_key_file: "
        f"file not found: '{tmp_path / 'absent'}' (from 'absent')"
    )
    assert parse_host_string("ssh://host?key_file=absent", check_files=False).key_file == tmp_path / "absent"


def test_recursive_yaml_anchor_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "all: &top\n  children:\n    g: *top\n")
    assert fails(path) == f"{path}: line 1, column 6: YAML error: found unconstructable recursive node"


# --- host names, Ansible keys, interpreters and control characters (issue 9) -------------------------


@pytest.mark.parametrize("name", ["-oProxyCommand=touch /tmp/x", "-x", ".hidden", "a b", "a/b", "a;b", "nöde", "'"])
def test_a_host_name_that_is_not_one_is_refused(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    {yaml_quote(name)}:\n")
    assert fails(path) == (
        f"{path}: host {name!r}: not a usable host name (letters, digits, '.', '_', '-', ':' or '%', "
        "not starting with '-' or '.')"
    )


def test_host_names_and_addresses_that_are_fine(tmp_path: Path) -> None:
    path = write(tmp_path, """
        all:
          hosts:
            node-1.lab.example: {ansible_host: 10.0.0.1}
            lab_2: {ansible_host: "fe80::1%eth0"}
            "::1":
            10.0.0.3:
        """)
    hosts = load_inventory(path).hosts
    assert list(hosts) == ["node-1.lab.example", "lab_2", "::1", "10.0.0.3"]
    assert hosts["lab_2"].host == "fe80::1%eth0" and hosts["::1"].host == "::1"


def test_an_address_that_is_an_option_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  hosts:\n    n1: {ansible_host: -oProxyCommand=evil}\n")
    assert fails(path) == (
        f"{path}: host 'n1': ansible_host: not a host name or address (letters, digits, '.', '_', '-', ':' or '%', "
        "not starting with '-' or '.'): '-oProxyCommand=evil'"
    )


def test_a_host_string_with_an_option_for_a_host_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"^host string 'ssh://-x:22': host '-x': not a usable host name"):
        parse_host_string("ssh://-x:22")


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("ansible_prot", "ansible_port"),
        ("ansible_hsot", "ansible_host"),
        ("ansible_usr", "ansible_user"),
        ("ansible_ssh_private_keyfile", "ansible_ssh_private_key_file"),
        ("ansible_pyhton_interpreter", "ansible_python_interpreter"),
        ("ansible_python3_interpreter", "ansible_python_interpreter"),
        ("ansible_conection", "ansible_connection"),
        ("ansible_become_usr", "ansible_become_user"),
    ],
)
def test_a_misspelled_ansible_key_is_an_error_with_a_suggestion(tmp_path: Path, key: str, meant: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    node1: {{{key}: x}}\n")
    assert fails(path).startswith(
        f"{path}: host 'node1': {key}: unknown Ansible variable (did you mean {meant}?); pytest-san reads "
        "ansible_connection, ansible_host, ansible_port, ansible_python_interpreter, ansible_ssh_private_key_file, "
        "ansible_user and ignores"
    )


def test_an_unknown_ansible_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  vars: {ansible_frobnicate: 1}\n")
    assert fails(path) == (
        f"{path}: group 'all': vars: ansible_frobnicate: unknown Ansible variable; pytest-san reads "
        "ansible_connection, ansible_host, ansible_port, ansible_python_interpreter, ansible_ssh_private_key_file, "
        "ansible_user and ignores Ansible's other connection, become and shell settings"
    )


@pytest.mark.parametrize(("key", "meant"), [("ansible_ssh_host", "ansible_host"), ("ansible_ssh_port", "ansible_port"),
                                            ("ansible_ssh_user", "ansible_user"),
                                            ("ansible_private_key_file", "ansible_ssh_private_key_file")])
def test_ansible_aliases_are_errors_not_silently_ignored(tmp_path: Path, key: str, meant: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    node1: {{{key}: x}}\n")
    assert fails(path) == (
        f"{path}: host 'node1': {key}: Ansible's other name for {meant}; write that (pytest-san reads only that name)"
    )


def test_ansible_settings_ignored_on_purpose_are_kept_in_extra(tmp_path: Path) -> None:
    keys = ["ansible_become", "ansible_become_flags", "ansible_become_plugin_option", "ansible_ssh_common_args",
            "ansible_ssh_pipelining", "ansible_remote_tmp", "ansible_shell_type", "ansible_perl_interpreter",
            "ansible_ruby_interpreter", "ansible_winrm_transport", "ansible_network_os", "ansible_timeout"]
    path = write(tmp_path, "all:\n  hosts:\n    node1: {" + ", ".join(f"{k}: v" for k in keys) + "}\n")
    assert load_inventory(path).hosts["node1"].extra == dict.fromkeys(keys, "v")


def test_an_interpreter_is_a_command_line(tmp_path: Path) -> None:
    path = write(tmp_path, """
        all:
          hosts:
            a: {ansible_python_interpreter: /usr/bin/env python3}
            b: {ansible_python_interpreter: "'/opt/my python/bin/python3' -X utf8"}
            c: {ansible_python_interpreter: /usr/bin/python3.11}
        """)
    hosts = load_inventory(path).hosts
    assert hosts["a"].python_argv == ["/usr/bin/env", "python3"]
    assert hosts["b"].python_argv == ["/opt/my python/bin/python3", "-X", "utf8"]
    assert hosts["c"].python_argv == ["/usr/bin/python3.11"]
    assert HostConfig(name="d", host="d").python_argv == ["/usr/bin/python3"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", "Ansible's interpreter discovery ('auto') is not supported: give the interpreter, e.g. /usr/bin/"),
        ("auto_silent", "Ansible's interpreter discovery ('auto_silent') is not supported"),
        ("-c print", "expected an interpreter before any option, got '-c print'"),
        ("\"'/usr/bin/python3\"", "cannot split \"'/usr/bin/python3\" into words: No closing quotation"),
        ("\"  \"", "expected an interpreter, got '  '"),
    ],
)
def test_bad_interpreters(tmp_path: Path, value: str, expected: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    node1: {{ansible_python_interpreter: {value}}}\n")
    assert fails(path).startswith(f"{path}: host 'node1': ansible_python_interpreter: {expected}")


@pytest.mark.parametrize(
    ("entry", "where", "char", "shown"),
    [
        ('san_device: "rxe\\0"', "host 'node1': san_device", "\\x00", "'rxe\\x00'"),
        ('ansible_user: "ro\\x01ot"', "host 'node1': ansible_user", "\\x01", "'ro\\x01ot'"),
        ('ansible_python_interpreter: "/usr/bin/python3\\0"', "host 'node1': ansible_python_interpreter", "\\x00",
         "'/usr/bin/python3\\x00'"),
        ('san_known_hosts: "kh\\0"', "host 'node1': san_known_hosts", "\\x00", "'kh\\x00'"),
        ('san_device: "rxe\\t0"', "host 'node1': san_device", "\\t", "'rxe\\t0'"),
        ('san_remote_tmp: "/tmp\\n"', "host 'node1': san_remote_tmp", "\\n", "'/tmp\\n'"),
        ('notes: "a\\0b"', "host 'node1': notes", "\\x00", "'a\\x00b'"),
        ('rack: [1, {shelf: "x\\x7f"}]', "host 'node1': rack", "\\x7f", "'x\\x7f'"),
        ('"na\\0me": 1', "host 'node1': variable name", "\\x00", "'na\\x00me'"),
    ],
)
def test_control_characters_are_refused_naming_host_and_key(tmp_path: Path, entry: str, where: str, char: str,
                                                            shown: str) -> None:
    path = write(tmp_path, f"all:\n  hosts:\n    node1: {{{entry}}}\n")
    assert fails(path) == f"{path}: {where}: control character '{char}' in {shown}; remove it"


def test_layout_characters_are_fine_in_vars_we_only_pass_along(tmp_path: Path) -> None:
    path = write(tmp_path, 'all:\n  hosts:\n    node1: {motd: "two\\nlines\\tand a tab"}\n')
    assert load_inventory(path).hosts["node1"].extra == {"motd": "two\nlines\tand a tab"}


def test_control_characters_in_group_and_host_names(tmp_path: Path) -> None:
    path = write(tmp_path, 'all:\n  children:\n    "g\\0":\n')
    assert fails(path) == f"{path}: group 'all': children: control character '\\x00' in 'g\\x00'; remove it"
    path = write(tmp_path, 'all:\n  hosts:\n    "n\\x1b":\n')
    assert fails(path) == f"{path}: group 'all': hosts: control character '\\x1b' in 'n\\x1b'; remove it"


def test_a_mapping_or_list_as_a_key_is_a_yaml_error(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  vars:\n    ? [a, b]\n    : 1\n")
    assert fails(path) == f"{path}: line 3, column 7: YAML error: a list cannot be a key"
    path = write(tmp_path, "all:\n  vars: {? {a: 1} : 1}\n")
    assert fails(path).startswith(f"{path}: line 2, column ")


def test_a_home_directory_of_an_unknown_user(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  hosts:\n    n1: {ansible_ssh_private_key_file: ~no-such-user-xyz/key}\n")
    assert fails(path).startswith(f"{path}: host 'n1': ansible_ssh_private_key_file: ")


def test_nesting_too_deep_is_an_inventory_error(tmp_path: Path) -> None:
    deep = "all: " + "{children: {g: " * 400 + "{}" + "}}" * 400 + "\n"
    assert "nested too deeply" in fails(write(tmp_path, deep))
    deeper = "all: {vars: {x: " + "[" * 5000 + "]" * 5000 + "}}\n"
    assert "nested too deeply" in fails(write(tmp_path, deeper))


def test_the_agent_command_line_starts_with_the_interpreters_words(tmp_path: Path) -> None:
    from hil.controller.backend import HilBackend
    from hil.controller.leases import LeasePolicy

    interpreter = shlex.join(["/usr/bin/env", "PYTHONDONTWRITEBYTECODE=1", sys.executable])
    path = write(tmp_path, f"""
        all:
          hosts:
            box:
              ansible_connection: local
              ansible_python_interpreter: {yaml_quote(interpreter)}
              san_engine: emulator
              san_remote_tmp: {tmp_path}
        """)
    (host,) = load_inventory(path).hosts.values()
    backend = HilBackend([host], leases=LeasePolicy(timeout=0, notify=lambda line: None))
    try:
        command = shlex.split(backend.agents[0].client.command)
        assert command[:3] == ["/usr/bin/env", "PYTHONDONTWRITEBYTECODE=1", sys.executable]
        assert command[3].endswith("/hil/agent/__main__.py")
        assert backend.leaks() == []
    finally:
        backend.close()


def yaml_quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar
