"""The kernel's RDMA resource tracking read over netlink (hil/agent/rdma_netlink.py).

Everywhere: the parser on messages laid out as nldev.c lays them out (nested tables, u64 values behind a pad
attribute, entries without keys as a user without CAP_NET_ADMIN gets them), and a kernel without RDMA
netlink (this project's machines) refused with the reason. With an RDMA device (a lab guest:
``san-hil lab ssh lab1 -- ... pytest tests/hil/agent/test_rdma_netlink.py``), the reader against iproute2's
``rdma -j resource show`` on the objects of a real verbs child: the same MRs with the same lengths and keys,
QPs, PDs, CQs, CM ids, contexts, and nothing left for its pid once it exited. ``SAN_REQUIRE_RDMA=1`` turns
the skips into an error.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hil.agent import rdma_netlink as nl
from hil.agent.engines.verbs import host
from pytest_san.spi.contract import Access

SYSFS = "/sys/class/infiniband"


def _attr(kind: int, payload: bytes, nested: bool = False) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind | (0x8000 if nested else 0)) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack("=I", value))


def _u64(kind: int, value: int) -> bytes:
    return _attr(0, b"") + _attr(kind, struct.pack("=Q", value))  # nla_put_u64_64bit may pad first


def _mr_dump(device: str, entries: list[bytes]) -> bytes:
    table = _attr(40, b"".join(_attr(41, e) for e in entries), nested=True)
    return _u32(1, 0) + _attr(2, device.encode() + b"\0") + table


def test_an_mr_dump_is_read_as_nldev_writes_it() -> None:
    root_entry = _u32(42, 0x1234) + _u32(43, 0x5678) + _u64(45, 8192) + _u32(62, 7) + _u32(60, 3) + _u32(28, 4242)
    user_entry = _u64(45, 4096) + _u32(62, 8) + _u32(60, 3) + _u32(28, 4243)  # no CAP_NET_ADMIN: no keys
    kernel_entry = _u64(45, 0) + _u32(62, 1) + _attr(29, b"ib_core\0")
    found = nl.parse_dump("mr", [_mr_dump("rxe0", [root_entry, user_entry]), _mr_dump("rxe0", [kernel_entry])])
    assert found == [
        {"device": "rxe0", "rkey": 0x1234, "lkey": 0x5678, "length": 8192, "mrn": 7, "pdn": 3, "pid": 4242},
        {"device": "rxe0", "length": 4096, "mrn": 8, "pdn": 3, "pid": 4243},
        {"device": "rxe0", "length": 0, "mrn": 1, "kern_name": "ib_core"},
    ]


def test_malformed_attributes_end_the_entry_not_the_reader() -> None:
    good = _u64(45, 4096) + _u32(62, 9)
    truncated = struct.pack("=HH", 40, 28) + b"\0\0"  # says 40 bytes, has 6
    assert nl.parse_dump("mr", [_mr_dump("siw0", [good + truncated])]) == [
        {"device": "siw0", "length": 4096, "mrn": 9}]
    assert nl.parse_dump("qp", [b"\xff\xff"]) == []


def test_every_kind_has_its_own_table_and_entry() -> None:
    assert set(nl.KINDS) == {"qp", "cm_id", "cq", "mr", "pd", "ctx"}
    assert len({k[0] for k in nl.KINDS.values()}) == len(nl.KINDS)  # one dump command each
    qp = _attr(19, _attr(20, _u32(21, 17) + _attr(26, b"\x02") + _attr(27, b"\x03") + _u32(60, 4) + _u32(28, 9)))
    assert nl.parse_dump("qp", [_attr(2, b"rxe0\0") + qp]) == [
        {"device": "rxe0", "lqpn": 17, "type": 2, "state": 3, "pdn": 4, "pid": 9}]


@pytest.mark.skipif(os.path.isdir(SYSFS), reason="this kernel has RDMA: the device tests below read it")
def test_a_kernel_without_rdma_netlink_says_so() -> None:
    with pytest.raises(nl.KernelUnreadable, match="this kernel has no RDMA netlink"):
        nl.read_resources()


def test_cap_net_admin_is_read_from_the_process_status() -> None:
    assert nl.cap_net_admin() == (os.geteuid() == 0 or _effective_cap(12))


def _effective_cap(bit: int) -> bool:
    with open("/proc/self/status") as f:
        caps = next(line for line in f if line.startswith("CapEff:"))
    return bool(int(caps.split()[1], 16) >> bit & 1)


# -- on a real device ---------------------------------------------------------------------------------------


def _skip_reason() -> str | None:
    if not os.path.isdir(SYSFS) or not os.listdir(SYSFS):
        return "no RDMA device: /sys/class/infiniband is absent or empty"
    if host.pyverbs_python() is None:
        return "pyverbs not importable"
    if shutil.which("rdma") is None:
        return "no rdma (iproute2) to compare with"
    return None


SKIP = _skip_reason()
if SKIP is not None and os.environ.get("SAN_REQUIRE_RDMA"):
    raise RuntimeError(f"SAN_REQUIRE_RDMA is set but the device tests cannot run: {SKIP}")
rdma = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[str, host.ChildProcess, host.ChildProcess]]:
    """Two verbs children joined by a connection, one registration of 8 KiB, one RDMA registration of 4 KiB."""
    device, port = host.select_device(os.environ.get("SAN_DEVICE"))
    address = host.device_address(device, port, os.environ.get("SAN_NETDEV"))[1]
    a = host.ChildProcess(device, port, address, python=host.pyverbs_python())
    b = host.ChildProcess(device, port, address, python=host.pyverbs_python())
    try:
        sb, where = b.socket_listen()
        sa = a.socket_connect(where)
        buf = a.call("alloc", nbytes=8192)
        a.call("register_memory", socket=sa, address=buf["address"], length=8192, access=Access.READWRITE)
        far = b.call("alloc", nbytes=4096)
        b.call("register_rdma_memory", socket=sb, address=far["address"], length=4096, access=Access.WRITE)
        yield device, a, b
    finally:
        a.close()
        b.close()


def _rdma_json(kind: str) -> list[dict[str, Any]]:
    out = subprocess.run(["rdma", "-j", "resource", "show", kind], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return list(json.loads(out or "[]"))


@rdma
def test_the_reader_lists_what_rdma_resource_show_lists(pair: tuple[str, host.ChildProcess, host.ChildProcess]) -> None:
    device, a, b = pair
    mine = {a.pid, b.pid}
    found = nl.read_resources(device)
    ours = {kind: [e for e in entries if e.get("pid") in mine] for kind, entries in found.items()}
    theirs = {kind: [e for e in _rdma_json(kind.replace("_", "-")) if e.get("pid") in mine] for kind in ("mr", "qp",
                                                                                                         "pd", "cq")}
    assert sorted((e["pid"], e["mrn"], e["length"]) for e in ours["mr"]) == \
        sorted((e["pid"], e["mrn"], e["mrlen"]) for e in theirs["mr"])
    assert 8192 in [e["length"] for e in ours["mr"] if e["pid"] == a.pid]
    assert 4096 in [e["length"] for e in ours["mr"] if e["pid"] == b.pid]
    if nl.cap_net_admin():  # keys only with CAP_NET_ADMIN (root in the lab); rdma -j prints them in hex
        assert sorted((e["mrn"], e["lkey"], e["rkey"]) for e in ours["mr"]) == \
            sorted((e["mrn"], int(e["lkey"], 16), int(e["rkey"], 16)) for e in theirs["mr"])
    assert sorted(e["lqpn"] for e in ours["qp"]) == sorted(e["lqpn"] for e in theirs["qp"])
    assert sorted(e["pdn"] for e in ours["pd"]) == sorted(e["pdn"] for e in theirs["pd"])
    assert sorted(e["cqn"] for e in ours["cq"]) == sorted(e["cqn"] for e in theirs["cq"])
    assert {e["pid"] for e in ours["ctx"]} == mine  # each child opened its own context
    assert [e for e in ours["cm_id"] if e["pid"] == a.pid]  # the active end's CM id


@rdma
def test_a_process_that_exited_holds_nothing(pair: tuple[str, host.ChildProcess, host.ChildProcess]) -> None:
    device = pair[0]
    child = host.ChildProcess(device, python=host.pyverbs_python())
    pid = child.pid
    assert [e for e in nl.read_resources(device)["ctx"] if e.get("pid") == pid]
    child.kill()
    left = {kind: [e for e in entries if e.get("pid") == pid] for kind, entries in nl.read_resources(device).items()}
    assert left == {kind: [] for kind in nl.KINDS}


def test_a_thread_is_named_by_its_process() -> None:
    """The kernel tags an object with the thread that made it; the reader names that thread's process."""
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.append(threading.get_native_id()))
    worker.start()
    worker.join()
    assert seen and seen[0] != os.getpid()
    assert nl.thread_group(threading.get_native_id()) == os.getpid()
    holder = threading.Thread(target=lambda: seen.append(nl.thread_group(threading.get_native_id())))
    holder.start()
    holder.join()
    assert seen[1] == os.getpid()  # asked while that thread ran
    assert nl.thread_group(2**22 + 1) == 2**22 + 1  # above any pid_max: no such task


_SECOND_THREAD = """
import json, os, sys, threading
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from hil.agent import rdma_netlink as nl
from hil.agent.engines.verbs.witness import unowned_objects

made, registered, release = [], threading.Event(), threading.Event()
def register():
    made.append(MR(pd, 12288, 7))
    made.append(threading.get_native_id())
    registered.set()
    release.wait(60)

with Context(name=sys.argv[1]) as ctx, PD(ctx) as pd:
    worker = threading.Thread(target=register)
    worker.start()
    registered.wait(60)
    during = [e for e in nl.read_resources(sys.argv[1])["mr"] if e.get("length") == 12288]
    release.set()
    worker.join()
    while os.path.exists(f"/proc/self/task/{made[1]}"):  # join returns before the kernel has let the thread go
        threading.Event().wait(0.01)
    after = nl.read_resources(sys.argv[1])
    print(json.dumps({"pid": os.getpid(), "thread": made[1], "during": during,
                      "after": [e for e in after["mr"] if e.get("length") == 12288],
                      "unowned": unowned_objects(after)}))
    made[0].close()
"""


@rdma
def test_an_mr_made_by_a_second_thread_belongs_to_its_process() -> None:
    """Measured for issue 30 on rxe and siw (6.12): rsockets' listen thread makes an accepted socket's MRs,
    so a reading by pid showed 0 MRs for a connected server, and once that thread ended the MRs had no pid
    at all. Here a second thread of a pyverbs process registers 12 KiB: the reader names the process as the
    MR's owner while the thread lives; once the thread has ended the MR is still the process's, untagged (the
    witness lists it as unowned) or tagged with the process's own pid: CI's fresh-clone run on rxe 6.12 at
    cd509d4 read pid and tgid 589, the process, after the thread had ended, where earlier runs read no pid."""
    device, _port = host.select_device(os.environ.get("SAN_DEVICE"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run([host.pyverbs_python() or "python3", "-c", _SECOND_THREAD, device], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": root}, check=True).stdout
    seen = json.loads(out)
    ours = [e for e in seen["during"] if e.get("tgid") == seen["pid"]]
    assert [e["pid"] for e in ours] == [seen["thread"]] and seen["thread"] != seen["pid"]
    mrn = ours[0]["mrn"]
    untagged = {k: v for k, v in ours[0].items() if k not in ("pid", "tgid")}
    after = [e for e in seen["after"] if e["mrn"] == mrn]
    assert after in ([untagged], [{**untagged, "pid": seen["pid"], "tgid": seen["pid"]}]), after
    assert (["mr", mrn] in seen["unowned"]) is ("pid" not in after[0])
