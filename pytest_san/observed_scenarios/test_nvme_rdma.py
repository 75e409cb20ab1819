"""NVMe over Fabrics on RDMA judged as a switch, by observation: the kernel's nvme-rdma host against nvmet-rdma,
and against a rogue target of ours that tries what the host advertised (docs/nvme-rdma.md).

Node 0 is the target (nvmet on a memory-backed null_blk namespace, or the rogue), node 1 the host. The host loads
nvme-rdma with ``--san-nvme-register-always`` (default Y, the kernel's). What the kernel holds is read by module
(``nvme_rdma``, ``nvmet_rdma``, ``rdma_cm``): objects made since the scenario's process started. Each step waits
at most its deadline; one that does not return is named with what the kernel held meanwhile, and the process's
cleanup disconnects, removes the target and unloads what was loaded.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from pytest_san.observed import NvmeFabric, RogueTarget

from .conftest import Nvme, record

pytestmark = pytest.mark.san_requires("nvme_rdma")

HOSTNQN = f"nqn.2014-08.org.nvmexpress:uuid:{uuid.uuid4()}"
SIZES = (4096, 128 * 1024, 1024 * 1024, 4 * 1024 * 1024)
"""One page, a few, one MR's worth on rxe and siw (256 pages), and more than one MR's worth: split into requests."""
ROGUE_ADMIN_TIMEOUT = 10  # seconds the host waits for a Connect the rogue left unanswered (kernel default 60)
KEY_READS = 300  # one block read after another: more than 256, an 8-bit key's period
KINDS = ("mr", "qp", "pd", "cq", "cm_id")


def nqn(request: pytest.FixtureRequest, suffix: str = "") -> str:
    name = request.node.name.replace("test_", "")[:40].replace("_", "-")
    return f"nqn.2026-12.io.pytest-san:{name}{suffix}-{uuid.uuid4().hex[:8]}"


def counts(held: Mapping[str, Any]) -> dict[str, int]:
    return {kind: len(held.get(kind, [])) for kind in KINDS if held.get(kind)}


def held(process: NvmeFabric) -> Mapping[str, Any]:
    kernel = process.kernel()
    if "unavailable" in kernel:
        pytest.skip(f"the kernel's RDMA record cannot be read on this host: {kernel['unavailable']}")
    return kernel


def served(nvme: Nvme, request: pytest.FixtureRequest, subsystems: int = 1) -> tuple[NvmeFabric, NvmeFabric,
                                                                                       list[dict[str, Any]]]:
    """A target on node 0 serving ``subsystems`` subsystems (ports 4420, 4421, ...), and a host on node 1 with
    nvme-rdma loaded as the run asks."""
    target = nvme.fabric(0)
    made = [target.target(nqn(request, f"-{i}"), port=4420 + i) for i in range(subsystems)]
    host = nvme.fabric(1)
    host.host_module(nvme.register_always)
    return target, host, made


def connected(host: NvmeFabric, made: Mapping[str, Any]) -> dict[str, Any]:
    return host.connect(made["address"], made["nqn"], HOSTNQN, port=made["port"])


def rogue_session(nvme: Nvme, request: pytest.FixtureRequest, probe: str) -> tuple[dict[str, Any], NvmeFabric]:
    """The rogue on node 0 runs ``probe`` against the host on node 1 connecting to it: what it found."""
    rogue: RogueTarget = nvme.rogue(0)
    where = rogue.listen()
    host = nvme.fabric(1)
    host.host_module(nvme.register_always)
    host.admin_timeout(ROGUE_ADMIN_TIMEOUT)
    started = rogue.start(probe)
    attempt = host.try_connect(where["address"], nqn(request), HOSTNQN, port=where["port"])
    found = rogue.finish(started)
    record(request, probe=probe, found=found, host_connect=attempt.get("error") or attempt.get("result"))
    read = found.get("read") or {}
    assert found.get("advertised"), f"the host's first command carried no keyed SGL: {found}"
    assert read.get("refused") is False and read.get("strings", {}).get("hostnqn") == HOSTNQN, (
        f"the rogue could not read even the range the host advertised for Connect: {read}")
    return found, host


def exposure(found: Mapping[str, Any], step: Mapping[str, Any], host: NvmeFabric, what: str) -> str:
    """What the rogue got that it should not have: the key, whether it is the PD's global one (the host asked
    no invalidation and its kernel said so), and the bytes."""
    advertised = found["advertised"]
    said = [line for line in host.kmsg() if "global rkey" in line]
    whose = (f"the PD's unsafe global rkey (the SGL asks no invalidation; the host's kernel: {said[0]!r})"
             if said and advertised.get("sub_type") == 0 else "a key the host registered for this request")
    data = step.get("bytes", "")
    return (f"{what}: the rogue target read {step.get('length')} bytes at {step.get('address', 0):#x} with key "
            f"{advertised['key']:#x}, {whose}; the host had advertised {advertised['length']} bytes at "
            f"{advertised['address']:#x} for {found.get('command')}; bytes read: {data[:128] or '(none)'}")


@pytest.mark.san_rule("R10")
def test_direct_io_of_every_size_reads_back_what_was_written(nvme: Nvme, request: pytest.FixtureRequest) -> None:
    """Direct I/O from one page to more than one MR's worth moves the bytes by RDMA through registered memory:
    each reads back exactly what was written, and the host holds MRs of nvme_rdma while connected."""
    _, host, made = served(nvme, request)
    namespace = connected(host, made[0])["namespace"]
    done = [host.io(namespace, size, offset=0, seed=size) for size in SIZES]
    record(request, io=done, register_always=nvme.register_always)
    wrong = [d["size"] for d in done if not d["equal"] or d["written"] != d["size"] or d["read"] != d["size"]]
    assert not wrong, f"direct I/O of {wrong} bytes did not read back what was written: {done}"
    assert held(host).get("mr"), "the host moved data by RDMA holding no MR of nvme_rdma's in the kernel's record"


@pytest.mark.san_rule("R11")
def test_disconnect_and_unload_release_everything(nvme: Nvme, request: pytest.FixtureRequest) -> None:
    """After ``nvme disconnect`` nothing of nvme_rdma's or the connection manager's made since the host started is
    left on the host; after the target is removed, nothing of nvmet_rdma's on the target; and nothing after
    ``modprobe -r`` of either module (ib_core's shared CQ pool is the device's, not theirs)."""
    target, host, made = served(nvme, request)
    namespace = connected(host, made[0])["namespace"]
    host.io(namespace, 1024 * 1024)
    during_host, during_target = counts(held(host)), counts(held(target))
    host.disconnect(made[0]["nqn"])
    after_host = held(host)
    target.untarget()
    after_target = held(target)
    unloaded = host.unload("nvme_rdma"), target.unload("nvmet_rdma")
    record(request, during_host=during_host, during_target=during_target, after_disconnect=counts(after_host),
           after_untarget=counts(after_target), unloaded=unloaded)
    assert during_host.get("mr") and during_target.get("qp"), (
        f"while connected the kernel's record shows host {during_host}, target {during_target}")
    assert not counts(after_host), f"after nvme disconnect the host's kernel still holds {after_host}"
    assert not counts(after_target), f"after the target was removed its kernel still holds {after_target}"
    assert not counts(held(host)) and not counts(held(target)), "objects appeared after modprobe -r"


@pytest.mark.san_rule("R8", "R5")
def test_a_peer_cannot_read_past_what_the_host_advertised(nvme: Nvme, request: pytest.FixtureRequest) -> None:
    """The rogue reads the range the Connect command's keyed SGL advertises, then bytes next to it inside the
    same page: the host's key must not reach them."""
    found, host = rogue_session(nvme, request, "outside")
    outside = found["outside"]
    assert outside.get("length"), f"no bytes next to the advertised range in its page: {found['advertised']}"
    assert outside["refused"], exposure(found, outside, host, f"memory {outside['where']} of what was advertised "
                                                            "was reachable")


@pytest.mark.san_rule("R3", "R5")
def test_a_key_is_dead_once_its_command_completed(nvme: Nvme, request: pytest.FixtureRequest) -> None:
    """The rogue answers Connect, waits for the host's next command (the Connect request is then over), and reads
    the Connect buffer again with the key it was given: the key must be dead."""
    found, host = rogue_session(nvme, request, "stale")
    assert found.get("next_command"), f"the host sent nothing after its Connect completed: {found}"
    assert found["stale"]["refused"], exposure(found, found["stale"], host, "the key outlived its command")


@pytest.mark.san_rule("R6")
def test_a_buffer_the_host_sends_from_cannot_be_written_by_the_peer(nvme: Nvme,
                                                                    request: pytest.FixtureRequest) -> None:
    """Connect's data goes from host to target: the target may read it, never write it (the rogue writes back the
    very bytes it read, so a write that lands changes nothing)."""
    found, _ = rogue_session(nvme, request, "write")
    wrote = found["write"]
    assert wrote["refused"], (f"the rogue target wrote {wrote['length']} bytes into the host's Connect buffer at "
                              f"{wrote['address']:#x} with key {found['advertised']['key']:#x}: a buffer the host "
                              "sends from is writable by its peer")


@pytest.mark.san_rule("R7")
def test_a_buffer_the_host_receives_into_cannot_be_read_by_the_peer(nvme: Nvme,
                                                                   request: pytest.FixtureRequest) -> None:
    """Identify's data goes from target to host: the target may write the host's buffer, never read it."""
    found, _ = rogue_session(nvme, request, "read")
    read = found.get("read_identify")
    assert read is not None, f"the host never sent Identify to the rogue: {found.get('commands')}"
    assert read["refused"], (f"the rogue target read {read['length']} bytes of the host's Identify buffer at "
                             f"{read['address']:#x} with key {read['key']:#x}: a buffer the host receives into is "
                             "readable by its peer")


@pytest.mark.san_rule("R2")
def test_each_controller_has_its_own_protection_domain(nvme: Nvme, request: pytest.FixtureRequest) -> None:
    """Two controllers on one host: a key one advertised must not be valid on the other's queue pairs, so each
    needs a protection domain of its own."""
    _, host, made = served(nvme, request, subsystems=2)
    for subsystem in made:
        connected(host, subsystem)
    pds = [pd for pd in held(host).get("pd", []) if pd.get("module") == "nvme_rdma"]
    record(request, pds=pds)
    listed = ", ".join(f"pdn {pd.get('pdn')} ({pd.get('users')} users)" for pd in pds)
    assert len(pds) >= 2, f"2 controllers share {len(pds)} protection domain(s) of nvme_rdma: {listed}"


@pytest.mark.san_rule("R3")
def test_a_pool_key_is_never_handed_out_again(nvme: Nvme, request: pytest.FixtureRequest) -> None:
    """One-block reads one after the other, the keys of nvme_rdma's MRs read from the kernel after each: no MR may
    advertise a key it advertised before."""
    if nvme.register_always == "N":
        pytest.skip("with register_always=N a one-block request carries the global key: no pool MR is used")
    _, host, made = served(nvme, request)
    namespace = connected(host, made[0])["namespace"]
    watched = host.key_cycle(namespace, KEY_READS)
    record(request, keys=watched)
    repeat = watched["repeat"]
    assert repeat is None, (f"MR {repeat['mrn']} of nvme_rdma advertised key {repeat['key']:#x} again after "
                            f"{repeat['uses']} requests")
