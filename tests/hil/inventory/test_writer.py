"""The inventory writer: what it writes is what the reader reads back, and it writes only what it must."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hil.inventory import HostConfig, inventory_data, load_inventory, write_inventory

EXAMPLES = int(os.environ.get("SAN_FUZZ_EXAMPLES", "100"))


def read_back(path: Path, group: str = "san") -> list[HostConfig]:
    return load_inventory(path, check_files=False).select(group)


def in_group(hosts: Sequence[HostConfig], group: str = "san") -> list[HostConfig]:
    """``hosts`` as the reader gives them back: in ``group``, the only group written."""
    return [dataclasses.replace(h, groups=(group,)) for h in hosts]


EVERY_FIELD = HostConfig(
    name="node-1", host="fe80::1%eth0", port=10022, user="yes", key_file=Path("/keys/id ed25519"),
    python_interpreter="/usr/bin/env python3", connection="local", engine="emulator", device="rxe0",
    netdev="eth1", gid_index=0, loopback=True, known_hosts=Path("/keys/known_hosts"),
    extra={"san_remote_tmp": "/var/tmp", "san_lab_address": "10.77.0.1", "notes": ["a", 1], "ansible_become": True},
)
DEFAULTS = HostConfig(name="bare", host="bare")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_every_field_and_every_default_read_back_unchanged(tmp_path: Path, suffix: str) -> None:
    hosts = [EVERY_FIELD, DEFAULTS]
    path = write_inventory(tmp_path / f"lab{suffix}", hosts)
    assert read_back(path) == in_group(hosts)


def test_json_is_json_and_yaml_has_the_comment(tmp_path: Path) -> None:
    data = inventory_data([DEFAULTS])
    assert json.loads((write_inventory(tmp_path / "lab.json", [DEFAULTS])).read_text()) == data
    text = write_inventory(tmp_path / "lab.yaml", [DEFAULTS], comment="line one\nline two").read_text()
    assert text.startswith("# line one\n# line two\nall:\n")
    assert yaml.safe_load(text) == data
    with pytest.raises(ValueError, match="JSON has no comments"):
        write_inventory(tmp_path / "lab.json", [DEFAULTS], comment="no")


def test_defaults_are_left_out_but_the_engine_is_always_written() -> None:
    named = dataclasses.replace(DEFAULTS, name="n1", host="n1")
    elsewhere = dataclasses.replace(DEFAULTS, name="n2", host="10.0.0.2", loopback=True)
    assert inventory_data([named, elsewhere], group="lab") == {"all": {"children": {"lab": {"hosts": {
        "n1": {"san_engine": "verbs"},
        "n2": {"ansible_host": "10.0.0.2", "san_engine": "verbs", "san_loopback": True},
    }}}}}


def test_shared_fields_are_written_once_in_the_group_vars(tmp_path: Path) -> None:
    common = HostConfig(name="-", host="127.0.0.1", user="root", key_file=Path("/lab/id"), engine="emulator",
                        device="rxe0", netdev="enp0s10")
    hosts = [dataclasses.replace(common, name=f"lab{i}", port=40020 + i) for i in (1, 2)]
    shared = ("device", "key_file", "engine", "host", "user", "gid_index")  # gid_index: None on both
    data = inventory_data(hosts, shared=shared)
    assert data == {"all": {"children": {"san": {
        "vars": {"ansible_host": "127.0.0.1", "ansible_user": "root", "ansible_ssh_private_key_file": "/lab/id",
                 "san_engine": "emulator", "san_device": "rxe0"},  # in the table's order
        "hosts": {"lab1": {"ansible_port": 40021, "san_netdev": "enp0s10"},
                  "lab2": {"ansible_port": 40022, "san_netdev": "enp0s10"}},
    }}}}
    assert read_back(write_inventory(tmp_path / "lab.yaml", hosts, shared=shared)) == in_group(hosts)


def test_shared_fields_must_be_fields_the_hosts_agree_on() -> None:
    hosts = [HostConfig(name="a", host="h", port=1), HostConfig(name="b", host="h", port=2)]
    with pytest.raises(ValueError, match=r"shared: the hosts differ in port: 1, 2"):
        inventory_data(hosts, shared=("port",))
    with pytest.raises(ValueError, match=r"shared: 'name', 'groups' is no HostConfig field with an inventory key"):
        inventory_data(hosts, shared=("name", "groups", "host"))


def test_an_extra_variable_may_not_stand_for_a_field() -> None:
    host = dataclasses.replace(DEFAULTS, extra={"ansible_port": 2222})
    with pytest.raises(ValueError, match="extra variable ansible_port is the field port"):
        inventory_data([host])


def test_importing_the_package_or_writing_json_does_not_import_yaml(tmp_path: Path) -> None:
    code = ("import sys\nfrom hil.inventory import HostConfig, write_inventory\nassert 'yaml' not in sys.modules\n"
            f"write_inventory({str(tmp_path / 'lab.json')!r}, [HostConfig(name='n', host='n')])\n"
            "assert 'yaml' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- any valid host reads back unchanged -----------------------------------------------------------

names = st.from_regex(r"[a-z0-9_][a-z0-9._-]{0,12}", fullmatch=True)
words = st.sampled_from(["root", "yes", "no", "null", "~", "1", "0x1f", "a b", "#x", "- x", "'q'", '"d"', "é"]) | names
paths = st.lists(words.filter(lambda w: "/" not in w and w not in (".", "..")), min_size=1, max_size=3).map(
    lambda parts: Path("/", *parts))
extras = st.dictionaries(st.sampled_from(["san_remote_tmp", "san_lab_address", "notes", "ansible_become"]), words,
                         max_size=3)


@st.composite
def host_configs(draw: st.DrawFn, name: str) -> HostConfig:
    return HostConfig(
        name=name,
        host=draw(names | st.sampled_from(["127.0.0.1", "::1", "fe80::1%eth0"]) | st.just(name)),
        port=draw(st.integers(1, 65535) | st.just(22)),
        user=draw(st.none() | words),
        key_file=draw(st.none() | paths),
        python_interpreter=draw(st.sampled_from(["/usr/bin/python3", "/usr/bin/env python3", "'/opt/a b/python'"])),
        connection=draw(st.sampled_from(["ssh", "local"])),
        engine=draw(st.sampled_from(["verbs", "emulator"])),
        device=draw(st.none() | words),
        netdev=draw(st.none() | words),
        gid_index=draw(st.none() | st.integers(0, 1 << 20)),
        loopback=draw(st.booleans()),
        known_hosts=draw(st.none() | paths),
        extra=draw(extras),
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(names, min_size=1, max_size=3, unique=True).flatmap(
    lambda ns: st.tuples(*(host_configs(n) for n in ns))), st.sampled_from([".yaml", ".json"]))
def test_any_valid_hosts_read_back_unchanged(hosts: tuple[HostConfig, ...], suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_inventory(Path(tmp) / f"lab{suffix}", hosts)
        assert read_back(path) == in_group(hosts)
