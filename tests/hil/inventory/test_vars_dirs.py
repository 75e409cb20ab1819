"""group_vars/ and host_vars/ beside an inventory: which files, in which order, Ansible's precedence, errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hil.inventory import InventoryError, load_inventory

# all > lab > san (san is lab's child); n1 in san, n2 in lab only.
INI = """
[san]
n1 san_netdev=host-line
[lab:children]
san
[lab]
n2
[san:vars]
san_device=ini-san
rack=ini-san
[lab:vars]
san_device=ini-lab
[all:vars]
san_device=ini-all
ansible_user=ini-all
motd=ini-all
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def fails(path: Path, start: Path) -> str:
    """The InventoryError's message loading ``path``; it must start with ``start``, the file at fault."""
    with pytest.raises(InventoryError) as info:
        load_inventory(path, check_files=False)
    message = str(info.value)
    assert message.startswith(f"{start}: "), message
    return message


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    return write(tmp_path / "hosts.ini", INI)


def test_ansible_precedence_any_group_vars_file_beats_the_inventory_files_group_vars(lab: Path) -> None:
    write(lab.parent / "group_vars/all.yml", "ansible_user: gv-all\nrack: gv-all\n")
    write(lab.parent / "group_vars/lab.yml", "rack: gv-lab\nmotd: gv-lab\n")
    write(lab.parent / "host_vars/n1.yml", "san_netdev: hv-n1\n")
    hosts = load_inventory(lab).hosts
    n1, n2 = hosts["n1"], hosts["n2"]
    # the inventory file: all < lab < san; then group_vars/all beats even san's own vars in the file
    assert (n1.device, n2.device) == ("ini-san", "ini-lab")
    assert (n1.user, n2.user) == ("gv-all", "gv-all")
    assert n1.extra["rack"] == "gv-lab"  # group_vars/lab.yml (a parent) beats [san:vars] in the file
    assert n1.extra["motd"] == n2.extra["motd"] == "gv-lab"
    assert n1.netdev == "hv-n1"  # host_vars beats the host line


def test_group_vars_files_follow_depth_then_name_and_hosts_beat_groups(lab: Path) -> None:
    write(lab.parent / "group_vars/all", "san_device: gv-all\n")
    write(lab.parent / "group_vars/san.yaml", "san_device: gv-san\n")
    write(lab.parent / "group_vars/lab.json", '{"san_device": "gv-lab", "san_netdev": "gv-lab"}')
    hosts = load_inventory(lab).hosts
    assert (hosts["n1"].device, hosts["n2"].device) == ("gv-san", "gv-lab")
    assert hosts["n1"].netdev == "host-line"  # the host line beats every group_vars file


def test_a_directory_of_files_is_read_in_lexical_order(lab: Path) -> None:
    for name, text in {
        "10-first.yml": "san_device: first\nrack: first\n",
        "20-second.yaml": "san_device: second\n",
        "30-sub/a.yml": "san_gid_index: 3\n",
        "40-noext": "rack: noext\n",
        "50.json": '{"motd": "json"}',
        ".hidden.yml": "san_device: hidden\n",
        "99-backup.yml~": "san_device: backup\n",
        "README.md": "not: [yaml\n",
        "old.d/x.yml": "san_device: old\n",  # a directory with an extension is not followed
    }.items():
        write(lab.parent / "group_vars/san" / name, text)
    n1 = load_inventory(lab).hosts["n1"]
    assert (n1.device, n1.gid_index, n1.extra["rack"], n1.extra["motd"]) == ("second", 3, "noext", "json")


def test_a_symbolic_link_loop_in_a_vars_directory_ends(lab: Path) -> None:
    write(lab.parent / "group_vars/san/a.yml", "san_device: a\n")
    (lab.parent / "group_vars/san/loop").symlink_to(lab.parent / "group_vars/san")
    assert load_inventory(lab).hosts["n1"].device == "a"


def test_vars_for_groups_and_hosts_the_inventory_lacks_are_not_read(lab: Path) -> None:
    write(lab.parent / "group_vars/gpu.yml", "san_enigne: [this is never read\n")
    write(lab.parent / "host_vars/n9.yml", "ansible_password: x\n")
    write(lab.parent / "group_vars/all.yml", "")  # empty: no variables
    assert load_inventory(lab).hosts["n1"].device == "ini-san"


def test_vars_directories_beside_a_yaml_inventory(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.yaml", "all:\n  children:\n    san:\n      hosts:\n        n1: {san_device: host}\n")
    write(tmp_path / "group_vars/san.yml", "san_device: group\nsan_engine: emulator\n")
    write(tmp_path / "host_vars/n1/x.yml", "san_gid_index: 2\n")
    n1 = load_inventory(path).hosts["n1"]
    assert (n1.device, n1.engine, n1.gid_index) == ("host", "emulator", 2)


def test_relative_paths_in_vars_files_resolve_against_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lab/.lab").mkdir(parents=True)
    (tmp_path / "lab/.lab/id").touch()
    write(tmp_path / "lab/lab.ini", "[san]\nn1\n")
    write(tmp_path / "lab/group_vars/san/keys.yml", "ansible_ssh_private_key_file: .lab/id\n")
    monkeypatch.chdir(tmp_path)
    assert load_inventory(Path("lab/lab.ini")).hosts["n1"].key_file == tmp_path / "lab/.lab/id"


# --- errors: each names the vars file ----------------------------------------------------------------


def test_a_bad_key_names_the_file_the_group_and_the_key(lab: Path) -> None:
    bad = write(lab.parent / "group_vars/san.yml", "san_enigne: verbs\n")
    assert fails(lab, bad).startswith(f"{bad}: group 'san': san_enigne: unknown key (did you mean san_engine?)")
    bad.unlink()
    bad = write(lab.parent / "group_vars/san/20-engine.yml", "san_engine: verb\n")
    assert fails(lab, bad) == f"{bad}: group 'san': san_engine: expected one of 'verbs', 'emulator', got 'verb'"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("host_vars/n1.yml", "ansible_port: 0\n", "host 'n1': ansible_port: expected an integer 1-65535, got 0"),
        ("host_vars/n1", "ansible_ssh_pass: x\n",
         "host 'n1': ansible_ssh_pass: passwords are not accepted; use SSH keys or ssh-agent"),
        ("group_vars/all.yml", "- a\n", "group 'all': expected a mapping of variables, got ['a']"),
        ("group_vars/all.yml", "a: 1\na: 2\n", "line 2, column 1: YAML error: duplicate key 'a'"),
        ("group_vars/lab.yml", "a: [1\n", "line 2, column 1: YAML error: expected ',' or ']', but got '<stream end>'"),
        ("group_vars/lab.yml", 'a: "x\\0"\n', "group 'lab': a: control character '\\x00' in 'x\\x00'; remove it"),
        ("group_vars/lab.yml", "a: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n",
         "line 1, column 4: YAML error: could not determine a constructor for the tag '!vault'"),
        ("group_vars/lab.yml", "$ANSIBLE_VAULT;1.1;AES256\n6162\n",
         "encrypted with ansible-vault, which pytest-san does not decrypt: the variables it reads hold no secrets "
         "(passwords are refused), so write them in plain text"),
    ],
)
def test_vars_file_errors_name_the_file(lab: Path, name: str, text: str, expected: str) -> None:
    bad = write(lab.parent / name, text)
    assert fails(lab, bad) == f"{bad}: {expected}"


def test_an_unreadable_vars_file_is_named(lab: Path) -> None:
    bad = lab.parent / "group_vars/san.yml"
    bad.parent.mkdir()
    bad.write_bytes(b"san_device: rx\xffe0\n")
    assert fails(lab, bad) == f"{bad}: cannot read: not UTF-8 text (invalid start byte at byte 14)"
    bad.unlink()
    bad.symlink_to(lab.parent / "nowhere")  # a dangling link is no file, as for Ansible
    assert load_inventory(lab).hosts["n1"].device == "ini-san"


def test_a_file_and_a_directory_for_one_group_is_an_error(lab: Path) -> None:
    write(lab.parent / "group_vars/san/a.yml", "san_device: dir\n")
    other = write(lab.parent / "group_vars/san.yml", "san_device: file\n")
    assert fails(lab, other) == (
        f"{other}: group 'san': {lab.parent / 'group_vars/san'} exists too, and Ansible would read only that one: "
        "keep one of them")


def test_group_names_that_are_no_file_names_have_no_vars_file(tmp_path: Path) -> None:
    path = write(tmp_path / "lab.yaml", "all:\n  children:\n    '..': {hosts: {n1: }}\n    a/b: {hosts: {n2: }}\n")
    write(tmp_path / "group_vars/x.yml", "san_device: [not, a, name]\n")  # read if ".." were the directory itself
    write(tmp_path / "group_vars/a/b.yml", "san_device: 1\n")
    assert [h.device for h in load_inventory(path).hosts.values()] == [None, None]
