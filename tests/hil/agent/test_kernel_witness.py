"""The kernel witness's judgement (hil/agent/engines/verbs/witness.py), on readings as the netlink reader gives
them: what a process declares against what the kernel holds for it; on a real device (a lab guest,
``SAN_REQUIRE_RDMA=1``) the planted engine bugs below show the same findings from a real kernel."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.agent.engines.verbs.witness import KernelWitness, judge
from hil.agent.rdma_netlink import KernelUnreadable
from pytest_san.spi.contract import Access

PID, OTHER = 4242, 999


def _kernel(**kinds: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {kind: kinds.get(kind, []) for kind in ("mr", "qp", "pd", "cq", "cm_id", "ctx")}


def _mr(mrn: int, length: int, lkey: int | None = None, rkey: int | None = None, pid: int = PID) -> dict[str, Any]:
    entry: dict[str, Any] = {"device": "rxe0", "mrn": mrn, "length": length, "pid": pid}
    if lkey is not None:
        entry["lkey"] = lkey
    if rkey is not None:
        entry["rkey"] = rkey
    return entry


def _own(pid: int = PID, **extra: Any) -> dict[str, list[dict[str, Any]]]:
    """A process's own context and CQ."""
    return {"ctx": [{"pid": pid, "ctxn": 1}], "cq": [{"pid": pid, "cqn": 2}], **extra}


SOCKET = {"id": 3, "qp": 1, "pd": 1, "cm_id": 1,
          "registrations": [{"kind": "memory", "key": 0x100, "address": 0x7000, "length": 8192},
                            {"kind": "rdma", "key": 0x2200, "address": 0x9000, "length": 4096}],
          "mrs": [{"what": "null page", "lkey": 0x300, "length": 4096}]}
PROCESS = {"pid": PID, "role": "default", "ctx": 1, "cq": 1, "sockets": [SOCKET]}


def _socket_objects(pid: int = PID) -> dict[str, list[dict[str, Any]]]:
    return {"qp": [{"pid": pid, "lqpn": 17}], "pd": [{"pid": pid, "pdn": 5}], "cm_id": [{"pid": pid, "cm_idn": 1}]}


def test_a_balanced_process_has_no_findings() -> None:
    kernel = _kernel(mr=[_mr(1, 8192, lkey=0x100), _mr(2, 4096, lkey=0x2201, rkey=0x2200), _mr(3, 4096, lkey=0x300),
                         _mr(9, 65536, pid=OTHER)],  # another process's: not ours to judge
                     **_own(), **_socket_objects())
    reading = judge("during", kernel, [PROCESS])
    assert reading["findings"] == []
    assert reading["processes"] == {str(PID): {"role": "default", "mr": [[1, 8192], [2, 4096], [3, 4096]],
                                               "qp": 1, "pd": 1, "cq": 1, "cm_id": 1, "ctx": 1}}


def test_without_keys_the_mrs_are_matched_by_length() -> None:
    kernel = _kernel(mr=[_mr(1, 4096), _mr(2, 8192), _mr(3, 4096)], **_own(), **_socket_objects())
    assert judge("during", kernel, [PROCESS])["findings"] == []


def test_an_mr_the_provider_does_not_report_is_named() -> None:
    """Under-reported registrations: the kernel holds one more MR than registrations() says."""
    under = {**SOCKET, "registrations": SOCKET["registrations"][:1]}
    kernel = _kernel(mr=[_mr(1, 8192, lkey=0x100), _mr(2, 4096, lkey=0x2201, rkey=0x2200), _mr(3, 4096, lkey=0x300)],
                     **_own(), **_socket_objects())
    findings = judge("during", kernel, [{**PROCESS, "sockets": [under]}])["findings"]
    assert findings == [f"pid {PID} (default) holds MR mrn 2 of 4096 bytes, lkey 0x2201, rkey 0x2200 that its "
                        "provider does not report"]


def test_what_the_kernel_holds_after_the_sockets_closed_is_left_over() -> None:
    """An MR never deregistered and a QP never destroyed, after close_socket: the books say nothing is open."""
    kernel = _kernel(mr=[_mr(7, 8192, lkey=0x100)], qp=[{"pid": PID, "lqpn": 17}], pd=[{"pid": PID, "pdn": 5}],
                     **_own())
    closed = {"pid": PID, "role": "spawned", "ctx": 1, "cq": 1, "sockets": []}
    findings = judge("after the test's cleanup", kernel, [closed])["findings"]
    assert findings == [
        f"pid {PID} (spawned) holds MR mrn 7 of 8192 bytes, lkey 0x100 that its provider does not report",
        f"pid {PID} (spawned) holds 1 QP(s) (lqpn 17), its books 0",
        f"pid {PID} (spawned) holds 1 PD(s) (pdn 5), its books 0",
    ]


def test_a_declared_object_the_kernel_does_not_hold_is_named() -> None:
    kernel = _kernel(mr=[_mr(1, 8192, lkey=0x100), _mr(3, 4096, lkey=0x300)], **_own(), **_socket_objects())
    findings = judge("during", kernel, [PROCESS])["findings"]
    assert findings == [f"pid {PID} (default): the kernel holds no MR of 4096 bytes for its rdma registration "
                        "0x2200 of socket 3"]


def test_a_process_that_exited_must_hold_nothing() -> None:
    kernel = _kernel(**_own(pid=OTHER), mr=[_mr(4, 4096, pid=OTHER)])
    findings = judge("at the session's end", kernel, [{"pid": OTHER, "role": "exited"}])["findings"]
    assert findings == [f"pid {OTHER} (exited) holds MR mrn 4 of 4096 bytes that its provider does not report",
                        f"pid {OTHER} (exited) holds 1 CQ(s) (cqn 2), its books 0",
                        f"pid {OTHER} (exited) holds 1 verbs context(s) (ctxn 1), its books 0"]


def test_a_witness_that_cannot_read_says_why_and_finds_nothing() -> None:
    def refused(device: str) -> dict[str, list[dict[str, Any]]]:
        raise KernelUnreadable(93, "this kernel has no RDMA netlink")

    witness = KernelWitness("rxe0", refused)
    assert witness.describe()["unavailable"] == "this kernel has no RDMA netlink"
    reading = witness.read("during", [PROCESS])
    assert reading == {"at": "during", "unavailable": "this kernel has no RDMA netlink", "processes": {},
                       "findings": []}
    assert witness.take() == [reading] and witness.take() == []


@pytest.mark.parametrize("at", ["during", "after the test's cleanup"])
def test_readings_are_kept_until_taken(at: str) -> None:
    witness = KernelWitness("rxe0", lambda d: _kernel(**_own()))
    witness.read(at, [{"pid": PID, "ctx": 1, "cq": 1}])
    assert [r["at"] for r in witness.take()] == [at]


def test_a_long_test_keeps_the_last_readings_and_every_finding() -> None:
    from hil.agent.engines.verbs.witness import KEPT

    witness = KernelWitness("rxe0", lambda d: _kernel(**_own()))
    witness.read("with the leak check", [{"pid": PID, "ctx": 0, "cq": 0}])  # a finding: kept
    for _ in range(KEPT + 10):
        witness.read("with the leak check", [{"pid": PID, "ctx": 1, "cq": 1}])
    assert len(witness.unreported()) == KEPT and witness.unreported() == []  # told once
    readings = witness.take()
    assert readings[0] == {"at": "dropped", "count": 11, "processes": {}, "findings": []}
    assert readings[1]["findings"] and all("reported" not in r for r in readings)
    assert len(readings) == 1 + KEPT


# -- on a real device: the verbs engine with a bug planted in its children (tests/support/planted_child.py) --


def _skip_reason() -> str | None:
    from hil.agent.engines.verbs import host

    if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
        return "no RDMA device: /sys/class/infiniband is absent or empty"
    if host.pyverbs_python() is None:
        return "pyverbs not importable"
    return None


SKIP = _skip_reason()
if SKIP is not None and os.environ.get("SAN_REQUIRE_RDMA"):
    raise RuntimeError(f"SAN_REQUIRE_RDMA is set but the device tests cannot run: {SKIP}")
rdma = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
PLANTED = Path(__file__).resolve().parents[2] / "support" / "planted_child.py"


@pytest.fixture
def engine(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The verbs engine on this host's device, its children running with the bug ``request.param`` planted
    (None: the engine as it is)."""
    from hil.agent.engines.verbs import host
    from hil.agent.engines.verbs.children import ChildProcess
    from hil.agent.engines.verbs.engine import VerbsEngine

    bug = getattr(request, "param", None)
    python = host.pyverbs_python()  # the agent runs with it; this test's own interpreter may lack pyverbs
    if bug is not None:
        wrapper = tmp_path / "python"
        wrapper.write_text(f"#!/bin/sh\nexec {python} {PLANTED} {bug} \"$@\"\n")
        wrapper.chmod(0o755)
        python = str(wrapper)
    monkeypatch.setattr(ChildProcess, "__init__", functools.partialmethod(ChildProcess.__init__, python=python))
    made = VerbsEngine("witness", device=os.environ.get("SAN_DEVICE"), netdev=os.environ.get("SAN_NETDEV"))
    yield made
    made.close()


def _connected(engine: Any) -> tuple[Any, Any, Any, Any]:
    a, b = engine.default_process, engine.spawn(spare=False)
    sa, sb = engine.connect_local(a, b)
    return a, b, sa, sb


def _kernel_leaks(engine: Any) -> list[str]:
    return [text for _, kind, text in engine.leaks() if kind == "kernel"]


@rdma
def test_the_engine_as_it_is_leaves_the_kernel_nothing(engine: Any) -> None:
    a, b, sa, sb = _connected(engine)
    buf = a.alloc(8192)
    handle = engine.provider.register_memory(sa, buf, Access.READWRITE)
    engine.kernel_reading("before the test's cleanup")
    engine.provider.deregister_memory(sa, handle)
    engine.provider.close_socket(sa)
    engine.provider.close_socket(sb)
    assert engine.leaks() == []
    readings = engine.kernel_readings()
    assert [r["at"] for r in readings] == ["before the test's cleanup", "with the leak check"]
    during = readings[0]["processes"][str(a.pid)]
    assert [length for _, length in during["mr"]] == [8192]  # the one registration, as the kernel saw it
    # one PD of the socket's and one of librdmacm's; the child's own context and librdmacm's
    assert during["qp"] == 1 and during["pd"] == 2 and during["ctx"] == 2 and during["cq"] == 1
    after = readings[1]["processes"]
    assert after[str(a.pid)]["mr"] == [] and after[str(a.pid)]["qp"] == 0 and after[str(b.pid)]["pd"] == 0
    assert after[str(a.pid)]["ctx"] == 2  # librdmacm keeps its context once it opened the device
    engine.reset()
    end = engine.end_session()
    assert end["findings"] == [] and end["at"] == "at the session's end"
    assert {str(a.pid), str(b.pid)} <= set(end["processes"])  # every process the agent ran, each now empty
    assert all(p["mr"] == [] and p["ctx"] == 0 for p in end["processes"].values())


@rdma
@pytest.mark.parametrize("engine", ["mr-not-deregistered"], indirect=True)
def test_an_mr_never_deregistered_is_caught_naming_process_and_region(engine: Any) -> None:
    a, _, sa, sb = _connected(engine)
    handle = engine.provider.register_memory(sa, a.alloc(8192), Access.READWRITE)
    engine.provider.deregister_memory(sa, handle)  # the planted bug: its MR stays
    engine.provider.close_socket(sa)
    engine.provider.close_socket(sb)
    leaks = engine.leaks()
    books = [text for _, kind, text in leaks if kind not in ("kernel", "pin")]
    pins = [text for _, kind, text in leaks if kind == "pin"]
    found = _kernel_leaks(engine)
    assert books == []  # the engine's own books see nothing
    # the kernel's books of pinned pages see the MR's two pages too (R12), apart from its resource tracking
    assert pins == [f"with the leak check: pid {a.pid} (default) has 2 page(s) pinned (VmPin 8 kB) that none of "
                    "its registrations or proxy pins explains: a pin outlived what needed it"]
    assert f"with the leak check: pid {a.pid} (default) holds MR mrn" in found[0]
    assert f"of 8192 bytes, lkey {handle:#x}" in found[0] and "that its provider does not report" in found[0]
    assert any(f"pid {a.pid} (default) holds 1 PD(s)" in text for text in found)


@rdma
@pytest.mark.parametrize("engine", ["qp-not-destroyed"], indirect=True)
def test_a_qp_never_destroyed_is_caught_naming_the_process(engine: Any) -> None:
    a, b, sa, sb = _connected(engine)
    engine.provider.close_socket(sa)
    engine.provider.close_socket(sb)
    found = _kernel_leaks(engine)
    for process in (a, b):
        assert any(f"with the leak check: pid {process.pid} " in t and "holds 1 QP(s) (lqpn " in t and
                   "its books 0" in t for t in found), found


@rdma
@pytest.mark.parametrize("engine", ["under-reported"], indirect=True)
def test_under_reported_registrations_are_caught_while_the_test_runs(engine: Any) -> None:
    a, _, sa, sb = _connected(engine)
    engine.provider.register_memory(sa, a.alloc(4096), Access.READ)
    hidden = engine.provider.register_memory(sa, a.alloc(12288), Access.READWRITE)
    assert len(engine.provider.registrations(sa)) == 1  # the planted bug: the provider reports one of two
    engine.kernel_reading("before the test's cleanup")
    engine.provider.close_socket(sa)
    engine.provider.close_socket(sb)
    found = _kernel_leaks(engine)
    assert found == [f"before the test's cleanup: pid {a.pid} (default) holds MR mrn "
                     f"{_mrn(found[0])} of 12288 bytes, lkey {hidden:#x}, rkey {_rkey(found[0])} that its provider "
                     "does not report"]


def _mrn(text: str) -> str:
    return text.split("MR mrn ")[1].split()[0]


def _rkey(text: str) -> str:
    return text.split("rkey ")[1].split()[0]


def test_an_mr_made_by_another_thread_of_the_process_is_its_own() -> None:
    """The kernel tags objects with the thread that made them; the reader adds the thread's process (tgid)."""
    thread = PID + 7
    kernel = _kernel(mr=[{**_mr(1, 8192, lkey=0x100, pid=thread), "tgid": PID}, _mr(2, 4096, lkey=0x2201, rkey=0x2200),
                         _mr(3, 4096, lkey=0x300)], **_own(), **_socket_objects())
    reading = judge("during", kernel, [PROCESS])
    assert reading["findings"] == []
    assert reading["processes"][str(PID)]["mr"] == [[1, 8192], [2, 4096], [3, 4096]]


def _unowned_mr(mrn: int) -> dict[str, Any]:
    return {"device": "rxe0", "mrn": mrn, "length": 65536}  # its thread ended: no pid, no kern_name


def test_an_object_whose_thread_ended_is_a_finding_at_the_end_when_the_session_made_it() -> None:
    state = {"kernel": _kernel(mr=[_unowned_mr(40)])}
    witness = KernelWitness("rxe0", read=lambda _device: state["kernel"])
    state["kernel"] = _kernel(mr=[_unowned_mr(40), _unowned_mr(41)])
    during = witness.read("during", [])
    assert during["unowned"] == [["mr", 40], ["mr", 41]] and during["findings"] == []
    end = witness.read("at the session's end", [], every=True)
    assert end["findings"] == ["the kernel holds MR mrn 41, made during the session by a thread that has ended "
                               "(no pid): nothing released it"]
