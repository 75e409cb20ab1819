"""The NVMe-oF driver's plumbing on this machine, without the kernel's NVMe modules: its bounded commands, its
state file and the cleanup that undoes what it made (on a configfs tree of files standing in for configfs), the
capability's checks, and the child under the agent's driver, read by module. The kernel's host and target are
judged on labs (pytest_san/observed_scenarios/test_nvme_rdma.py)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hil.agent.nvme import available, fabric
from hil.agent.observe.driver import ObservedChild, held_by_modules, run_cleanup


def test_a_command_past_its_bound_fails_naming_it() -> None:
    with pytest.raises(fabric.CallFailed, match=r"sleep 5 did not return within 0.2 s") as caught:
        fabric.run(["sleep", "5"], timeout=0.2)
    assert caught.value.code == errno.ETIMEDOUT


def test_a_failing_command_says_its_exit_and_output() -> None:
    with pytest.raises(fabric.CallFailed, match=r"exited 3: oops"):
        fabric.run([sys.executable, "-c", "import sys; print('oops'); sys.exit(3)"])


def test_the_state_file_survives_the_process(tmp_path: Path) -> None:
    state = fabric.State(tmp_path / "s.json")
    state.add("connected", "nqn.a")
    state.add("targets", {"nqn": "nqn.b", "port": 4420, "nullb": "sanb1", "port_id": 1})
    again = fabric.State(tmp_path / "s.json")
    assert again.data["connected"] == ["nqn.a"] and again.data["targets"][0]["nqn"] == "nqn.b"
    again.drop("connected", "nqn.a")
    assert fabric.State(tmp_path / "s.json").data["connected"] == []


@pytest.fixture
def fake_configfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "config"
    monkeypatch.setattr(fabric, "NVMET", root / "nvmet")
    monkeypatch.setattr(fabric, "NULLB", root / "nullb")
    monkeypatch.setattr(fabric, "SYS_MODULE", tmp_path / "module")
    nqn = "nqn.2026-12.io.pytest-san:t"
    subsystem = root / "nvmet" / "subsystems" / nqn
    (subsystem / "namespaces" / "1").mkdir(parents=True)
    (subsystem / "namespaces" / "1" / "enable").write_text("1")
    port = root / "nvmet" / "ports" / "1" / "subsystems"
    port.mkdir(parents=True)
    os.symlink(subsystem, port / nqn)
    (root / "nullb" / "sanb1").mkdir(parents=True)
    return root


def test_cleanup_removes_a_target_in_reverse_and_forgets_it(fake_configfs: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # configfs removes an entry's attribute files with it; plain directories need them gone first.
    real_rmdir = Path.rmdir

    def rmdir(self: Path) -> None:
        for child in self.iterdir():
            if child.is_file():
                child.unlink()
            elif child.is_dir() and not child.is_symlink():
                rmdir(child)
        real_rmdir(self)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    state = fabric.State(tmp_path / "s.json")
    state.add("targets", {"nqn": "nqn.2026-12.io.pytest-san:t", "port": 4420, "nullb": "sanb1", "port_id": 1})
    assert fabric.cleanup(state) == []
    assert not list((fake_configfs / "nvmet" / "subsystems").iterdir())
    assert not list((fake_configfs / "nvmet" / "ports").iterdir())
    assert not (fake_configfs / "nullb" / "sanb1").exists()
    assert fabric.State(tmp_path / "s.json").data["targets"] == []


def test_cleanup_of_nothing_made_says_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fabric, "SYS_MODULE", tmp_path / "module")
    state = fabric.State(tmp_path / "s.json")
    state.add("connected", "nqn.never")  # never connected: no controller of it in sysfs
    assert fabric.cleanup(state) == [] and state.data["connected"] == []


def test_io_takes_whole_blocks_only(tmp_path: Path) -> None:
    fab = fabric.Fabric(fabric.State(tmp_path / "s.json"), None, None)
    with pytest.raises(ValueError, match="whole 4096-byte blocks: size 1000"):
        fab.io(str(tmp_path / "dev"), 1000)


def test_register_always_is_y_or_n(tmp_path: Path) -> None:
    fab = fabric.Fabric(fabric.State(tmp_path / "s.json"), None, None)
    with pytest.raises(ValueError, match="Y or N, not 'maybe'"):
        fab.host_module("maybe")


def test_a_target_needs_an_address(tmp_path: Path) -> None:
    fab = fabric.Fabric(fabric.State(tmp_path / "s.json"), None, None)
    with pytest.raises(fabric.CallFailed, match="no --address"):
        fab.target("nqn.x")


# -- the capability --------------------------------------------------------------------------------------------

def test_the_capability_needs_the_modules_and_nvme_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        assert available.nvme_rdma_available() == "the agent does not run as root (modprobe, configfs)"
        return
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert available.nvme_rdma_available("r", tmp_path) == "no nvme-cli (nvme) on the PATH"
    (bin_dir / "nvme").write_text("#!/bin/sh\n")
    (bin_dir / "nvme").chmod(0o755)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "modules.dep").write_text("kernel/drivers/nvme/host/nvme-rdma.ko.xz: nvme-fabrics.ko\n"
                                                "kernel/drivers/nvme/host/nvme-fabrics.ko.xz:\n")
    assert available.nvme_rdma_available("r", tmp_path) == "kernel r ships no nvmet-rdma, null_blk, nvmet"
    with (tmp_path / "r" / "modules.dep").open("a") as f:
        f.write("kernel/drivers/nvme/target/nvmet-rdma.ko.xz:\nkernel/drivers/nvme/target/nvmet.ko:\n")
    (tmp_path / "r" / "modules.builtin").write_text("kernel/drivers/block/null_blk/null_blk.ko\n")
    assert available.nvme_rdma_available("r", tmp_path) is None


# -- read by module, and cleaned up after ------------------------------------------------------------------------

def reading(*entries: tuple[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in ("mr", "qp", "pd", "cq", "cm_id", "ctx")}
    for kind, entry in entries:
        out[kind].append(entry)
    return out


def test_kernel_objects_are_read_by_module_since_the_start() -> None:
    before = {("mr", 1)}
    now = reading(("mr", {"mrn": 1, "kern_name": "nvme_rdma", "length": 0}),
                  ("mr", {"mrn": 2, "kern_name": "nvme_rdma", "length": 4096, "rkey": 0x1234}),
                  ("pd", {"pdn": 3, "kern_name": "nvme_rdma", "unsafe_global_rkey": 0xA30E, "users": 162}),
                  ("cq", {"cqn": 4, "kern_name": "ib_core"}),  # the shared CQ pool: the device's baseline
                  ("qp", {"lqpn": 5, "kern_name": "rdma_cm"}),
                  ("mr", {"mrn": 6, "pid": 99, "length": 8}))
    held = held_by_modules(now, ("nvme_rdma", "nvmet_rdma", "rdma_cm"), before)
    assert [m["mrn"] for m in held["mr"]] == [2] and held["mr"][0]["module"] == "nvme_rdma"
    assert held["pd"] == [{"pdn": 3, "module": "nvme_rdma", "unsafe_global_rkey": 0xA30E, "users": 162}]
    assert held["cq"] == [] and [q["lqpn"] for q in held["qp"]] == [5]
    assert held["modules"] == {"nvme_rdma": 2, "rdma_cm": 1}


def test_a_cleanup_command_runs_when_the_child_is_killed_and_a_slow_one_is_bounded(tmp_path: Path) -> None:
    marker = tmp_path / "cleaned"
    stand_in = tmp_path / "child.py"
    stand_in.write_text("import json, os, sys\n"
                        "print(json.dumps({'id': 0, 'result': {'pid': os.getpid()}}), flush=True)\n"
                        "sys.stdin.read()\n")
    child = ObservedChild(None, read=lambda: reading(), argv=[sys.executable, str(stand_in)], program="nvme",
                          modules=("nvme_rdma",),
                          cleanup=[sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x'); print('done')"])
    assert child.kernel()["modules"] == {}
    child.kill()
    assert marker.exists() and child.cleaned == {"code": 0, "said": "done"}
    assert run_cleanup(["sleep", "5"], deadline=0.3)["hang"] == 0.3


def test_the_program_as_the_agent_runs_it(tmp_path: Path) -> None:
    """fabric.py as a child: its hello, a call, an error naming what is missing, and the cleanup on kill."""
    if os.geteuid() != 0:
        pytest.skip("the NVMe-oF driver runs as root")
    state = tmp_path / "state.json"
    child = ObservedChild(None, read=lambda: reading(), program="nvme", modules=available.OWNERS,
                          extra=["--state", str(state)],
                          cleanup=[sys.executable, fabric.__file__, "--cleanup", "--state", str(state)])
    try:
        assert child.hello["program"] == "nvme"
        assert set(child.call("parameters")["result"]) == {"register_always", "admin_timeout", "loaded"}
        assert isinstance(child.call("kmsg")["result"], list)
        refused = child.call("target", {"nqn": "nqn.x"})
        assert "no --address" in refused["error"]["message"]
        assert "no call 'reboot'" in child.call("reboot")["error"]["message"]
    finally:
        child.kill()
    assert child.cleaned is not None and child.cleaned["code"] == 0 and not state.exists()
