"""Faults on the real verbs path of a Soft-RoCE lab (``san-hil lab up``): issue 4, item 4.

Run only when ``SAN_LAB_INVENTORY`` names the inventory of a running lab (otherwise every test is
skipped, saying so)::

    SAN_LAB_INVENTORY=/tmp/lab.yaml pytest tests/hil/lab/test_lab_faults.py -v

Each test builds its own :class:`HilBackend` on the lab's ``san`` hosts and closes it, and leaves the
lab as it found it (link up, guest running, a fresh agent), so the rest of a CI job can use it:

- the lab NIC taken down mid-transfer: the provider reports the failure with an error completion within
  a bounded time, closing the connection still releases everything, and rxe0's port is ACTIVE again;
- a guest frozen (its qemu stopped with SIGSTOP: a guest that is gone, without killing the lab): a call
  with a short timeout fails within that timeout with an error naming the host;
- the agent killed with SIGKILL: its verbs children exit, the kernel holds no MR, QP, PD or CQ of theirs,
  and ``reset()`` brings a fresh agent with nothing leaked.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from hil.controller.backend import Agent, HilBackend
from hil.controller.client import AgentError
from hil.inventory import HostConfig
from hil.lab.procs import group_members
from hil.lab.state import LabState
from hil.transport import TransportError
from hil.transport.base import CLOSE_GRACE
from hil.transport.ssh import KILL_TIMEOUT
from pytest_san import Access, Completion, SanError, Status, Switch
from tests.support.lab_hosts import running_lab_hosts

TRANSFER = 16 << 20  # bytes per RDMA write in the link test (about 1.5 s each under TCG)
TRANSFER_SECONDS = 4.0  # the posted writes should take about this long, so the link drops mid-transfer
MAX_WINDOW = 32  # writes posted at once, at most (the send queue holds 64)
FAILURE_BOUND = 30.0  # seconds from the link going down to the error completion (observed: ~3 s)
PORT_BOUND = 30.0  # seconds for rxe0's port to be ACTIVE again once the link is up
CALL_TIMEOUT = 5.0  # the short call timeout of the frozen-guest test
SLACK = 5.0  # what a failing call may take beyond its timeout
CONT_SAFETY = 120  # seconds after which a watchdog resumes a frozen guest even if this process died
GONE_BOUND = 20.0  # seconds for a killed agent's children to exit
RUN_TIMEOUT = 30.0  # for commands on the guests


# --- the lab -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab_hosts() -> list[HostConfig]:
    return running_lab_hosts()


@contextlib.contextmanager
def lab_backend(hosts: Sequence[HostConfig]) -> Iterator[HilBackend]:
    backend = HilBackend(hosts)
    try:
        yield backend
    finally:
        backend.close()


def run(agent: Agent, argv: Sequence[str], timeout: float = RUN_TIMEOUT) -> str:
    """``argv`` on the agent's host; its stdout, or an assertion naming the host and the command."""
    result = agent.transport.run(list(argv), timeout=timeout)
    assert result.returncode == 0, f"{agent.host.name}: {' '.join(argv)} exited {result.returncode}: {result.stderr}"
    return result.stdout


def port_state(agent: Agent) -> str:
    """rxe0's port state as sysfs says it, e.g. ``4: ACTIVE`` or ``1: DOWN``."""
    hello = agent.client.hello
    device, port = hello.get("device") or agent.host.device, hello.get("port") or 1
    return run(agent, ["cat", f"/sys/class/infiniband/{device}/ports/{port}/state"]).strip()


def active(agent: Agent) -> Callable[[], bool]:
    return lambda: "ACTIVE" in port_state(agent)


def wait_for(what: str, check: Callable[[], bool], timeout: float, pause: float = 0.5) -> float:
    """Seconds until ``check()`` held; fails the test after ``timeout``."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            pytest.fail(f"{what}: not within {timeout:g} s")
        time.sleep(pause)
    return time.monotonic() - began


def write_once(backend: HilBackend, nbytes: int = 64 * 1024) -> Completion:
    """A fresh connection between the first two hosts, one RDMA write across it, closed again."""
    conn = Switch(backend).connect()
    try:
        a, b = conn.local, conn.remote
        src, dst = a.process.alloc(nbytes), b.process.alloc(nbytes)
        src.write(b"\x5a" * nbytes)
        handle = a.provider.register_memory(a.socket, src, Access.READ)
        desc = b.provider.register_rdma_memory(b.socket, dst, Access.WRITE)
        done = a.provider.rdma_write(a.socket, [(src, handle)], desc).wait(timeout=60)
        assert dst.read(nbytes) == b"\x5a" * nbytes
        return done
    finally:
        conn.close()


# --- a. the lab NIC taken down mid-transfer ----------------------------------------------------------


@pytest.mark.parametrize("side", ["target", "initiator"])
def test_link_down_mid_transfer(lab_hosts: list[HostConfig], side: str) -> None:
    with lab_backend(lab_hosts) as backend:
        conn = Switch(backend).connect()
        a, b = conn.local, conn.remote
        victim = backend.agents[1 if side == "target" else 0]
        netdev = victim.host.netdev
        assert netdev, f"{victim.host.name}: no san_netdev in the inventory: cannot take the lab NIC down"
        src, dst = a.process.alloc(TRANSFER), b.process.alloc(TRANSFER)
        src.write(bytes(range(256)) * 256)
        handle = a.provider.register_memory(a.socket, src, Access.READ)
        desc = b.provider.register_rdma_memory(b.socket, dst, Access.WRITE)

        began = time.monotonic()  # one write first: how long the transfer takes on this lab
        warm = a.provider.rdma_write(a.socket, [(src, handle)], desc).wait(timeout=60)
        assert warm.status is Status.SUCCESS, f"the link is not usable before the fault: {warm}"
        per_write = time.monotonic() - began
        window = max(2, min(MAX_WINDOW, math.ceil(TRANSFER_SECONDS / per_write)))
        ops = [a.provider.rdma_write(a.socket, [(src, handle)], desc) for _ in range(window)]
        assert not ops[-1].done(), (f"{window} writes of {TRANSFER} bytes finished before the link could go down "
                                    f"({per_write:.2f} s each): nothing would be mid-transfer")
        completions: list[Completion] = []
        failed: Completion | None = None
        try:
            run(victim, ["ip", "link", "set", netdev, "down"])
            down = time.monotonic()
            state_down = port_state(victim)
            for op in ops:  # in send-queue order: the first error completion is the report we want
                try:
                    completions.append(op.wait(timeout=max(0.0, down + FAILURE_BOUND - time.monotonic())))
                except TimeoutError:
                    pytest.fail(f"{side} {victim.host.name}: {netdev} down, but no error completion within "
                                f"{FAILURE_BOUND:g} s (completed so far: {completions})")
                if completions[-1].status is not Status.SUCCESS:
                    failed = completions[-1]
                    break
            reported = time.monotonic() - down
            # The socket is unusable from then on: a new write is refused or completes in error.
            with contextlib.suppress(SanError):
                late = a.provider.rdma_write(a.socket, [(src, handle)], desc).wait(timeout=FAILURE_BOUND)
                assert late.status is not Status.SUCCESS, f"a write after the failure succeeded: {late}"
        finally:
            run(victim, ["ip", "link", "set", netdev, "up"])
        print(f"{side} {victim.host.name} {netdev} down: port {state_down!r}; {len(ops)} writes posted, "
              f"{len(completions) - 1} done before the error {failed} after {reported:.2f} s")
        assert "ACTIVE" not in state_down, f"{victim.host.name}: rxe0 still {state_down} with {netdev} down"
        assert failed is not None, f"no error completion within {FAILURE_BOUND:g} s: {completions}"
        assert reported <= FAILURE_BOUND

        conn.close()  # releases the registrations above and the switch's own (R11), after the failure
        assert backend.leaks() == []
        for agent in backend.agents:
            waited = wait_for(f"{agent.host.name}: rxe0 port ACTIVE again", active(agent), PORT_BOUND)
            print(f"{agent.host.name}: port ACTIVE {waited:.1f} s after the link came up")
        # The lab works again for whatever runs next.
        assert write_once(backend).status is Status.SUCCESS
        assert backend.leaks() == []


# --- b. a guest that is gone (frozen) ----------------------------------------------------------------


def qemu_pid(host: HostConfig) -> int:
    """The pid of ``host``'s qemu, from the lab state next to its key; skip when it is not a lab guest."""
    if host.key_file is None:
        pytest.skip(f"{host.name}: no key file in the inventory, so no san-hil lab state to find its qemu in")
    state = LabState.load(host.key_file.parent)  # `lab up` keeps the lab's keys in its state directory
    guest = next((g for g in state.guests if g.name == host.name and g.ssh_port == host.port), None) if state else None
    if guest is None or guest.pgid is None:
        pytest.skip(f"{host.name}: not a guest of a san-hil lab on this machine ({host.key_file.parent}): "
                    "its qemu cannot be frozen from here")
    pids = [pid for pid, comm in group_members(guest.pgid) if comm.startswith("qemu")]
    assert pids, f"{host.name}: no qemu in process group {guest.pgid}: is the lab up? (san-hil lab status)"
    return pids[0]


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block; a detached watchdog resumes it even if this process dies meanwhile."""
    watchdog = subprocess.Popen(["sh", "-c", f"sleep {CONT_SAFETY}; kill -CONT {pid}"], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        os.killpg(watchdog.pid, signal.SIGKILL)  # its own group: the shell and its sleep
        watchdog.wait()


def test_frozen_guest_fails_the_call_naming_the_host(lab_hosts: list[HostConfig]) -> None:
    host = lab_hosts[0]
    qemu = qemu_pid(host)
    with lab_backend(lab_hosts) as backend:
        conn = Switch(backend).connect()
        agent = backend.agents[0]
        agent.client.call_timeout = CALL_TIMEOUT
        with frozen(qemu):
            began = time.monotonic()
            with pytest.raises(AgentError) as call_error:
                conn.local.process.alloc(64)
            call_took = time.monotonic() - began
            began = time.monotonic()
            with pytest.raises(TransportError) as run_error:
                agent.transport.run(["true"], timeout=CALL_TIMEOUT)
            run_took = time.monotonic() - began
            began = time.monotonic()
            agent.close()  # giving up on it: bounded, although the host answers nothing
            close_took = time.monotonic() - began
        print(f"frozen {host.name}: agent call failed after {call_took:.1f} s: {call_error.value}\n"
              f"command failed after {run_took:.1f} s: {run_error.value}\n"
              f"closing the agent took {close_took:.1f} s")
        assert str(call_error.value).startswith(f"host {host.name} (") and "agent" in str(call_error.value)
        assert call_took <= CALL_TIMEOUT + SLACK
        assert str(run_error.value).startswith(f"{host.name} (")
        assert run_took <= CALL_TIMEOUT + SLACK
        assert close_took <= 3 * CLOSE_GRACE + KILL_TIMEOUT + SLACK

        # Resumed, the guest serves again: a fresh agent replaces the one given up on, nothing leaked.
        old = agent.client.channel.pid
        began = time.monotonic()
        backend.reset()
        print(f"reset after the guest resumed: {time.monotonic() - began:.1f} s")
        assert backend.agents[0].client.channel.pid != old
        assert backend.leaks() == []
        assert write_once(backend).status is Status.SUCCESS


# --- c. the agent killed -----------------------------------------------------------------------------


def rdma_resources(agent: Agent, kind: str) -> list[dict[str, Any]]:
    """``rdma -j resource show KIND`` on the agent's host (entries carry ``pid`` and ``comm``)."""
    value = json.loads(run(agent, ["rdma", "-j", "resource", "show", kind]) or "[]")
    assert isinstance(value, list), f"rdma -j resource show {kind}: {value!r}"
    return [v for v in value if isinstance(v, dict)]


def owned_by(agent: Agent, pids: set[int]) -> dict[str, list[dict[str, Any]]]:
    kinds = ("mr", "qp", "pd", "cq")
    found = {kind: [r for r in rdma_resources(agent, kind) if r.get("pid") in pids] for kind in kinds}
    return {kind: entries for kind, entries in found.items() if entries}


def running(agent: Agent, pids: set[int]) -> set[int]:
    """Which of ``pids`` still run on the host (a zombie has exited: it holds nothing)."""
    script = 'for p; do s=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null) && [ "$s" != Z ] && echo $p; done; true'
    return {int(p) for p in run(agent, ["sh", "-c", script, "sh", *map(str, sorted(pids))]).split()}


def kernel_books(agent: Agent) -> dict[str, Any]:
    """What the guest's kernel holds for the proxy module: its live objects, the reserve ratio (NOLOWMEM), the
    machine's long-term pins (after vm.stat_refresh folded the per-CPU counters in)."""
    out = run(agent, ["sh", "-c", "echo 1 > /proc/sys/vm/stat_refresh; cat /sys/class/misc/san_proxy/live; "
                                  "echo ratio $(cat /proc/sys/vm/lowmem_reserve_ratio); grep nr_foll_pin /proc/vmstat"])
    fields = [line.split(None, 1) for line in out.splitlines() if line.strip()]
    values = {k: v.strip() for k, v in fields}
    live = {k: int(v) for k, v in values.items() if k not in ("ratio", "nr_foll_pin_acquired", "nr_foll_pin_released")}
    return {"live": live, "ratio": values["ratio"],
            "foll_pins": int(values["nr_foll_pin_acquired"]) - int(values["nr_foll_pin_released"])}


def hold_proxy_objects(proxy: Any, buf: Any) -> None:
    """A pin, a contiguous block, a DMA adapter with a common buffer and NOLOWMEM (where it has it), held."""
    from pytest_san import FOUR_GIB, CacheType, DeviceDescription

    proxy.pin(buf)
    assert proxy.allocate_contiguous(3 * 4096, 0, FOUR_GIB - 1, 0, CacheType.WRITE_COMBINED) is not None
    description = DeviceDescription.zeroed()
    description.version, description.master, description.dma32, description.maximum_length = 2, True, True, 1 << 20
    assert proxy.get_dma_adapter(description).allocate_common_buffer(2 * 4096, False) is not None
    with contextlib.suppress(SanError):  # a guest with all its memory below 4 GiB has no NOLOWMEM
        proxy.set_nolowmem(True)


def test_an_oops_in_a_guest_ends_the_run_with_its_first_lines(lab_hosts: list[HostConfig]) -> None:
    """The guest's kernel log shows an oops (planted: written into /dev/kmsg): the next leak check ends the
    backend, one line naming the host, then the report's first lines; every later reset says the same."""
    from hil.controller.errors import BackendBroken

    with lab_backend(lab_hosts) as backend:
        agent = backend.agents[0]
        run(agent, ["sh", "-c", "printf '<2>BUG: pytest-san planted oops\\n' > /dev/kmsg; "
                                "printf '<4>RIP: 0010:planted+0x0/0x10 [san_proxy]\\n' > /dev/kmsg"])
        assert backend.leaks() == []  # the oops is not a leak: it ends the backend
        with pytest.raises(BackendBroken) as err:
            backend.reset()
        first, *rest = str(err.value).splitlines()
        assert first.startswith(f"{agent.host.name}: its kernel reported trouble during this test")
        assert rest[:2] == ["  BUG: pytest-san planted oops", "  RIP: 0010:planted+0x0/0x10 [san_proxy]"]
        with pytest.raises(BackendBroken):
            backend.reset()
    with lab_backend(lab_hosts) as fresh:  # a new agent looks from its own start on
        assert fresh.leaks() == []
        fresh.reset()


def test_killed_agent_leaves_nothing_registered(lab_hosts: list[HostConfig]) -> None:
    with lab_backend(lab_hosts) as backend:
        agent = backend.agents[0]
        module = (agent.proxy or {}).get("kind") == "kernel module"  # san_proxy: the agent holds its objects too
        quiet = kernel_books(agent) if module else {}  # before the test pins anything
        conn = Switch(backend).connect()
        a = conn.local
        buf = a.process.alloc(1 << 20)
        a.provider.register_memory(a.socket, buf, Access.READ)
        other = a.process.node.spawn_process()  # a second modelled process: a second child of the agent
        other.alloc(4096)
        peer = conn.remote
        window = peer.process.alloc(1 << 16)
        peer.provider.register_rdma_memory(peer.socket, window, Access.WRITE)
        if module:
            hold_proxy_objects(a.proxy, buf)
            held = kernel_books(agent)
            assert held["live"]["pins"] == 1 and held["live"]["contiguous"] == 1, held
            assert held["live"]["common_buffers"] == 1 and held["foll_pins"] > quiet["foll_pins"], held

        pid = agent.client.channel.pid
        assert pid is not None
        children = {int(p) for p in run(agent, ["ps", "-o", "pid=", "--ppid", str(pid)]).split()}
        assert len(children) >= 2, f"{agent.host.name}: agent {pid} has children {children}, expected two or more"
        theirs = {pid, *children}
        before = owned_by(agent, theirs)
        assert before.get("mr") and before.get("qp"), f"the check cannot see the agent's registrations: {before}"

        run(agent, ["kill", "-9", str(pid)])
        took = wait_for(f"{agent.host.name}: agent {pid} and its children {sorted(children)} gone",
                        lambda: not running(agent, theirs), GONE_BOUND)
        after = owned_by(agent, theirs)
        print(f"agent {pid} killed: {sorted(children)} gone after {took:.1f} s; held before "
              f"{ {k: len(v) for k, v in before.items()} }, after {after}")
        assert after == {}, f"{agent.host.name}: the kernel still holds resources of {theirs}: {after}"
        if module:  # the module's objects went with the agent's file, NOLOWMEM too; no page stays pinned
            left = kernel_books(agent)
            assert all(v == 0 for v in left["live"].values()), left
            assert left["ratio"] == quiet["ratio"] and left["foll_pins"] == quiet["foll_pins"], (quiet, left)

        with pytest.raises(AgentError) as err:  # the controller learns it at its next call, naming the host
            a.process.alloc(64)
        assert str(err.value).startswith(f"host {agent.host.name} (")
        backend.reset()
        fresh = backend.agents[0].client.channel.pid
        assert fresh is not None and fresh != pid
        assert backend.leaks() == []
        assert write_once(backend).status is Status.SUCCESS
