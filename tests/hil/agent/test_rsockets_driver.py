"""The rsockets child's protocol and the agent's bounded handling of a call that hangs or a child that dies
(``hil/agent/rsockets``).

Without RDMA: the real child program answers its protocol (hello, buffers, bad requests, exit) over the host's
real librdmacm; the driver's deadline, kill and "gone" answers are shown with a stand-in program (plumbing
only: it proves nothing of rsockets). On a device (``SAN_REQUIRE_RDMA=1`` in a lab guest): two real children
over rsockets, and the ``rclose`` with a live ``riomap`` that never returns, bounded and named.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.agent.observe import driver
from hil.agent.observe.driver import CHILD, ObservedChild, held_by

SYSFS = "/sys/class/infiniband"


def _no_kernel() -> dict[str, list[dict[str, Any]]]:
    return {kind: [] for kind in driver.KINDS}


def _child(**kwargs: Any) -> ObservedChild:
    return ObservedChild(None, read=_no_kernel, **kwargs)


@pytest.fixture
def child() -> Iterator[ObservedChild]:
    if driver.rsockets_library() is None:
        pytest.skip("no librdmacm with the rsocket calls on this host")
    c = _child(python=sys.executable)
    yield c
    c.kill()


def test_the_child_says_hello_with_its_pid_and_library(child: ObservedChild) -> None:
    assert child.hello["pid"] == child.pid
    assert "rdmacm" in child.hello["library"]


def test_buffers_round_trip(child: ObservedChild) -> None:
    buf = child.call("alloc", {"length": 4096})["result"]
    assert buf["length"] == 4096 and buf["address"] % 4096 == 0
    child.call("fill", {"buf": buf["buf"], "data": base64.b64encode(b"abc").decode(), "offset": 10})
    peeked = child.call("peek", {"buf": buf["buf"], "length": 14})["result"]
    assert base64.b64decode(peeked) == bytes(10) + b"abc\0"


def test_an_unknown_call_is_named_and_the_child_goes_on(child: ObservedChild) -> None:
    outcome = child.call("rfork", {})
    assert "no call 'rfork'" in outcome["error"]["message"] and "riowrite" not in outcome["error"]["message"]
    assert "iowrite" in outcome["error"]["message"]
    assert child.call("alloc", {"length": 1})["result"]["length"] == 1


def test_bad_arguments_are_an_error_not_a_crash(child: ObservedChild) -> None:
    outcome = child.call("peek", {"buf": 99, "length": 1})
    assert outcome["error"]["call"] == "peek" and "KeyError" in outcome["error"]["message"]
    assert child.alive


def test_rsocket_answers_a_result_or_its_errno(child: ObservedChild) -> None:
    """Without a device librdmacm refuses (an errno); with one it gives a socket: never a crash."""
    outcome = child.call("rsocket", {})
    if "error" in outcome:
        assert outcome["error"]["call"] == "rsocket" and isinstance(outcome["error"]["errno"], int)
        assert os.path.isdir(SYSFS) is False or not os.listdir(SYSFS) or outcome["error"]["errno"] != 0
    else:
        assert isinstance(outcome["result"], int) and outcome["result"] >= 0


def test_exit_ends_the_child_and_reads_the_kernel(child: ObservedChild) -> None:
    out = child.exit(deadline=30)
    assert out["code"] == 0 and not child.alive
    assert out["held"]["mr"] == [] and out["held"]["unowned"] == {}


def test_a_library_without_rsockets_is_a_clear_refusal(tmp_path: Path) -> None:
    with pytest.raises(driver.NotStarted, match="no rsockets here: cannot load librdmacm's rsocket calls"):
        _child(argv=[sys.executable, CHILD, "--library", str(tmp_path / "librdmacm-missing.so")])


def test_a_malformed_line_is_answered_and_the_child_goes_on() -> None:
    if driver.rsockets_library() is None:
        pytest.skip("no librdmacm with the rsocket calls on this host")
    lines_in = b'{"id": 1\n{"id": 2, "call": "alloc", "args": {"length": 8}}\n'
    proc = subprocess.run([sys.executable, CHILD], input=lines_in, capture_output=True, timeout=60)
    lines = proc.stdout.decode().splitlines()
    assert '"id": 0' in lines[0]
    assert "not a request" in lines[1] and '"id": 2, "result"' in lines[2]


# -- the agent's bounds, with a stand-in program (plumbing only) ----------------------------------------------

STAND_IN = textwrap.dedent("""
    import json, sys, os, time
    print(json.dumps({"id": 0, "result": {"pid": os.getpid(), "library": "stand-in"}}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["call"] == "spin":
            while True:
                pass
        if req["call"] == "block":
            time.sleep(3600)
        if req["call"] == "crash":
            os._exit(7)
        print(json.dumps({"id": req["id"], "result": req["call"]}), flush=True)
""")


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[ObservedChild]:
    program = tmp_path / "stand_in.py"
    program.write_text(STAND_IN)
    c = _child(argv=[sys.executable, str(program)])
    yield c
    c.kill()


@pytest.mark.parametrize("call", ["spin", "block"])
def test_a_call_past_its_deadline_is_a_hang_naming_it_and_the_child_is_killed(stand_in: ObservedChild,
                                                                              call: str) -> None:
    assert stand_in.call("ping", {})["result"] == "ping"
    outcome = stand_in.call(call, {"fd": 3}, deadline=0.5)
    hang = outcome["hang"]
    assert hang["call"] == call and hang["deadline"] == 0.5
    assert hang["state"] != "gone" and isinstance(hang["cpu"], float)
    assert hang["held"]["mr"] == [] and hang["steps"][-1] == f"{call}(fd=3)"
    assert not stand_in.alive
    assert stand_in.call("ping", {}) == {"gone": f"child {stand_in.pid} was killed when {call} hung"}
    assert stand_in.exit()["code"] == -9


def test_a_child_that_dies_during_a_call_is_gone_with_its_code(stand_in: ObservedChild) -> None:
    outcome = stand_in.call("crash", {}, deadline=30)
    assert "exited (code 7)" in outcome["gone"]


def test_a_call_in_the_background_is_finished_later(stand_in: ObservedChild) -> None:
    started = stand_in.start("accept", {"fd": 1})
    assert stand_in.finish(started, "accept", 30)["result"] == "accept"
    assert stand_in.describe()["calls"] == ["accept(fd=1) in the background"]


def test_the_kernel_is_read_by_thread_group_and_ownerless_objects_since_the_start() -> None:
    kernel = {"mr": [{"mrn": 1, "length": 56, "pid": 11, "tgid": 10}, {"mrn": 2, "length": 8, "pid": 20, "tgid": 20},
                     {"mrn": 3, "length": 131072}, {"mrn": 4, "length": 4096}, {"mrn": 5, "kern_name": "ib_core"}],
              "qp": [{"lqpn": 7, "pid": 10, "tgid": 10, "pdn": 2, "state": 3}]}
    held = held_by(kernel, 10, unowned_before={("mr", 4)})
    assert held["mr"] == [{"mrn": 1, "length": 56}]
    assert held["qp"] == [{"lqpn": 7, "pdn": 2, "state": 3}]
    assert held["unowned"] == {"mr": [{"mrn": 3, "length": 131072}]}


# -- on a device: rsockets itself -----------------------------------------------------------------------------


def _skip_reason() -> str | None:
    if not os.path.isdir(SYSFS) or not os.listdir(SYSFS):
        return "no RDMA device: /sys/class/infiniband is absent or empty"
    if driver.rsockets_library() is None:
        return "no librdmacm with the rsocket calls"
    return None


SKIP = _skip_reason()
if SKIP is not None and os.environ.get("SAN_REQUIRE_RDMA"):
    raise RuntimeError(f"SAN_REQUIRE_RDMA is set but the device tests cannot run: {SKIP}")
rdma = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@rdma
def test_rclose_with_a_live_riomap_is_a_bounded_hang_on_a_device() -> None:
    from hil.agent.engines.verbs import host

    device, port = host.select_device(os.environ.get("SAN_DEVICE"))
    address = host.device_address(device, port, os.environ.get("SAN_NETDEV"))[1]
    a, b = ObservedChild(device, address), ObservedChild(device, address)
    try:
        lfd = a.call("rsocket")["result"]
        a.call("iomapsize", {"fd": lfd, "slots": 1})
        where = a.call("listen", {"fd": lfd})["result"]
        started = a.start("accept", {"fd": lfd})
        cfd = b.call("rsocket")["result"]
        b.call("iomapsize", {"fd": cfd, "slots": 1})
        assert b.call("connect", {"fd": cfd, **where}) == {"result": 0}
        afd = a.finish(started, "accept")["result"]
        assert len(a.kernel()["mr"]) == 3 and len(b.kernel()["mr"]) == 3  # control, send, receive
        buf = a.call("alloc", {"length": 4096})["result"]["buf"]
        assert a.call("iomap", {"fd": afd, "buf": buf, "offset": 0}) == {"result": 0}
        assert [m["length"] for m in a.kernel()["mr"]].count(4096) == 1
        hang = a.call("close", {"fd": afd}, deadline=10)["hang"]
        assert hang["call"] == "close" and 4096 in [m["length"] for m in hang["held"]["mr"]]
        assert hang["after_kill"]["mr"] == [] and hang["after_kill"]["qp"] == []
        assert b.exit()["held"]["mr"] == []
    finally:
        a.kill()
        b.kill()


def test_the_agent_answers_an_observed_process_over_its_protocol(stand_in: ObservedChild) -> None:
    """The verbs engine's kind for the driver is ``observed``, whose methods the agent dispatches (plumbing)."""
    from hil.agent.dispatch import Dispatcher, EngineCodec, Registry
    from hil.agent.engines.verbs.engine import VerbsEngine

    registry = Registry(VerbsEngine.kind_of)
    dispatcher = Dispatcher(EngineCodec(registry, lambda p, a, n: None), {})
    oid = registry.ref(stand_in)["$o"]
    assert registry.kind_of(stand_in) == "observed"
    reply = dispatcher.handle({"id": 1, "obj": oid, "method": "call", "args": ["ping", {"fd": 1}, 5.0]})
    assert reply == {"id": 1, "result": {"result": "ping"}}
    reply = dispatcher.handle({"id": 2, "obj": oid, "method": "describe", "args": []})
    assert reply["result"]["pid"] == stand_in.pid and reply["result"]["calls"] == ["ping(fd=1)"]
    reply = dispatcher.handle({"id": 3, "obj": oid, "method": "kernel", "args": []})
    assert reply["result"]["mr"] == [] and reply["result"]["unowned"] == {}
    reply = dispatcher.handle({"id": 4, "obj": oid, "method": "kill", "args": []})
    assert "error" not in reply and not stand_in.alive
