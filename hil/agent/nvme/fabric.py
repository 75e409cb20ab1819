"""The kernel's NVMe over Fabrics on RDMA, driven on one lab host: the target (nvmet-rdma over configfs, a
memory-backed null_blk namespace) or the host (nvme-rdma through nvme-cli), and direct I/O through it.

    python3 fabric.py --state FILE [--address 10.77.0.2]
    python3 fabric.py --cleanup --state FILE

Run by the agent as a child under observation (``hil.agent.observe.driver``, program ``nvme``), one JSON line at
a time (``hil.agent.observe.serve``), so that a step the kernel never finishes is named and ended by the agent
(the kernel's record is then read by module: ``nvme_rdma``, ``nvmet_rdma``, ``rdma_cm``). Everything the child
makes is written to the state file as it goes; ``--cleanup`` undoes it, each step bounded, and the agent runs it
whenever the child ends. Calls (each answers a mapping):

* ``target(nqn, port=4420, size_mb=64)``: a subsystem ``nqn`` open to any host, namespace 1 on a fresh
  memory-backed null_blk device, served on this host's address and ``port``;
* ``untarget()``: that target removed;
* ``host_module(register_always)``: ``nvme-rdma`` loaded with ``register_always`` Y or N (a read-only
  parameter: the module is reloaded when it has the other value);
* ``admin_timeout(seconds)``: nvme-core's admin command timeout for controllers made from now on (a rogue
  target leaves the host's Connect unanswered when it kills the queue; the default waits 60 s);
* ``connect(address, nqn, hostnqn, port=4420, keep_alive=30, ctrl_loss=5, reconnect_delay=1, queues=1,
  deadline=60)``: ``nvme connect -t rdma``; ``{"controller", "namespace", "seconds"}``;
* ``io(namespace, size, offset=0, seed=1)``: a direct write of ``size`` bytes, a direct read of them back;
  ``{"equal", "seconds", ...}``;
* ``key_cycle(namespace, reads)``: ``reads`` direct reads of one block, one after the other, the keys of
  ``nvme_rdma``'s MRs read from the kernel after each: the first MR whose key comes back (``{"repeat": {"mrn",
  "key", "uses"}}``), else ``{"repeat": None}``;
* ``disconnect(nqn)``: ``nvme disconnect``, waiting until the controller is gone;
* ``unload(modules)``: ``modprobe -r`` each, bounded; ``{"left": [...]}``;
* ``kmsg()``: the kernel's log lines since the child started (or since the last ``kmsg``);
* ``parameters()``: ``register_always``, ``admin_timeout``, and whether the modules are loaded.

Standard library only, Python 3.9+; it must run as root.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import mmap
import os
import random
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script by the agent: its tree is importable from three levels up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from hil.agent.observe.serve import CallFailed, Server, own_stdout

METHODS = ("target", "untarget", "host_module", "admin_timeout", "connect", "io", "key_cycle", "disconnect", "unload",
           "kmsg", "parameters")
CONFIGFS = Path("/sys/kernel/config")
NVMET = CONFIGFS / "nvmet"
NULLB = CONFIGFS / "nullb"
SYS_MODULE = Path("/sys/module")
STEP = 30.0  # seconds any one command may take (modprobe, nvme disconnect)
MODULES_HOST = ("nvme_rdma", "nvme_fabrics")
MODULES_TARGET = ("nvmet_rdma", "nvmet", "null_blk")
BLOCK = 4096  # direct I/O's alignment and granularity (the namespace's block is 512 bytes)


def run(cmd: list[str], timeout: float = STEP, call: str = "") -> str:
    """Run ``cmd`` within ``timeout``; its output, else CallFailed naming the command and what it said."""
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise CallFailed(call or cmd[0], errno.ETIMEDOUT, f"{' '.join(cmd)} did not return within {timeout} s") \
            from None
    except OSError as exc:
        raise CallFailed(call or cmd[0], exc.errno or 0, f"{' '.join(cmd)}: {exc}") from None
    said = (done.stdout + done.stderr).decode(errors="replace").strip()
    if done.returncode != 0:
        raise CallFailed(call or cmd[0], 0, f"{' '.join(cmd)} exited {done.returncode}: {said[-600:]}")
    return said


def write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CallFailed("configfs", exc.errno or 0, f"writing {value!r} to {path}: {exc.strerror}") from None


def loaded(module: str) -> bool:
    return (SYS_MODULE / module / "initstate").exists() or (SYS_MODULE / module / "refcnt").exists()


def parameter(module: str, name: str) -> str | None:
    try:
        return (SYS_MODULE / module / "parameters" / name).read_text().strip()
    except OSError:
        return None


class State:
    """What the child made, on disk as it goes, so that a killed child's cleanup finds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"targets": [], "connected": [], "loaded": [], "admin_timeout": None}
        if path.exists() and path.stat().st_size:
            with contextlib.suppress(ValueError, OSError):
                self.data.update(json.loads(path.read_text()))

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)

    def add(self, key: str, value: Any) -> None:
        if value not in self.data[key]:
            self.data[key].append(value)
        self.save()

    def drop(self, key: str, value: Any) -> None:
        if value in self.data[key]:
            self.data[key].remove(value)
        self.save()


class Fabric:
    def __init__(self, state: State, address: str | None, device: str | None) -> None:
        self.state = state
        self.address = address
        self.device = device
        self._kmsg = self._open_kmsg()

    # -- modules -------------------------------------------------------------------------------

    def _modprobe(self, module: str, *params: str) -> None:
        was = loaded(module.replace("-", "_"))
        run(["modprobe", module, *params], call="modprobe")
        if not was:
            self.state.add("loaded", module.replace("-", "_"))

    def host_module(self, register_always: str) -> dict[str, Any]:
        value = register_always.upper()[:1]
        if value not in ("Y", "N"):
            raise ValueError(f"register_always is Y or N, not {register_always!r}")
        if loaded("nvme_rdma") and parameter("nvme_rdma", "register_always") != value:
            run(["modprobe", "-r", "nvme_rdma"], call="modprobe -r nvme_rdma")
        self._modprobe("nvme-rdma", f"register_always={value}")
        now = parameter("nvme_rdma", "register_always")
        if now != value:
            raise CallFailed("host_module", 0, f"nvme_rdma's register_always reads {now!r} after loading it with "
                                               f"{value}")
        return {"register_always": now}

    def admin_timeout(self, seconds: int) -> dict[str, Any]:
        self._modprobe("nvme-core")
        path = SYS_MODULE / "nvme_core" / "parameters" / "admin_timeout"
        old = path.read_text().strip()
        if self.state.data["admin_timeout"] is None:
            self.state.data["admin_timeout"] = old
            self.state.save()
        write(path, str(int(seconds)))
        return {"admin_timeout": int(seconds), "was": int(old)}

    def unload(self, modules: list[str]) -> dict[str, Any]:
        left, said = [], {}
        for module in modules:
            if not loaded(module):
                continue
            try:
                run(["modprobe", "-r", module], call=f"modprobe -r {module}")
                self.state.drop("loaded", module)
            except CallFailed as exc:
                said[module] = str(exc)
            if loaded(module):
                left.append(module)
        return {"left": left, "said": said}

    def parameters(self) -> dict[str, Any]:
        return {"register_always": parameter("nvme_rdma", "register_always"),
                "admin_timeout": parameter("nvme_core", "admin_timeout"),
                "loaded": sorted(m for m in MODULES_HOST + MODULES_TARGET + ("rdma_cm",) if loaded(m))}

    # -- the target ----------------------------------------------------------------------------

    def target(self, nqn: str, port: int = 4420, size_mb: int = 64) -> dict[str, Any]:
        if not self.address:
            raise CallFailed("target", 0, "no --address: the target has no address to serve on")
        self._modprobe("nvmet-rdma")  # configfs with it: /sys/kernel/config appears once configfs is loaded
        if not os.path.ismount(CONFIGFS):  # the lab's guests do not mount it
            run(["mount", "-t", "configfs", "none", str(CONFIGFS)], call="mount configfs")
        self._modprobe("null_blk", "nr_devices=0")
        name = f"sanb{zlib.crc32(nqn.encode()):08x}"  # the disk's name too, on kernels that name it so
        record: dict[str, Any] = {"nqn": nqn, "port": port, "nullb": name, "port_id": None}
        self.state.add("targets", record)
        nullb = NULLB / name
        nullb.mkdir(exist_ok=True)
        for attribute, value in (("size", str(size_mb)), ("blocksize", "512"), ("memory_backed", "1"),
                                 ("power", "1")):
            write(nullb / attribute, value)
        # Recent kernels name the disk after the configfs entry, older ones nullb<index>; devtmpfs makes the
        # node a moment after power is on.
        names = (name, f"nullb{(nullb / 'index').read_text().strip()}")
        until = time.monotonic() + STEP
        while not any(Path(f"/dev/{n}").exists() for n in names):
            if time.monotonic() > until:
                raise CallFailed("target", errno.ENODEV, f"no block device /dev/{names[0]} or /dev/{names[1]} "
                                                         f"{STEP} s after powering null_blk's {name} on")
            time.sleep(0.05)
        device = next(f"/dev/{n}" for n in names if Path(f"/dev/{n}").exists())
        subsystem = NVMET / "subsystems" / nqn
        subsystem.mkdir(exist_ok=True)
        write(subsystem / "attr_allow_any_host", "1")
        namespace = subsystem / "namespaces" / "1"
        namespace.mkdir(exist_ok=True)
        write(namespace / "device_path", device)
        write(namespace / "enable", "1")
        port_id = self._free_port_id()
        record["port_id"] = port_id
        self.state.save()
        where = NVMET / "ports" / str(port_id)
        where.mkdir()
        for attribute, value in (("addr_trtype", "rdma"), ("addr_adrfam", "ipv4"), ("addr_traddr", self.address),
                                 ("addr_trsvcid", str(port))):
            write(where / attribute, value)
        try:
            os.symlink(subsystem, where / "subsystems" / nqn)
        except OSError as exc:
            raise CallFailed("target", exc.errno or 0, f"serving {nqn} on {self.address}:{port}: {exc.strerror} "
                                                       "(is another target or listener on that port?)") from None
        return {"nqn": nqn, "address": self.address, "port": port, "device": device, "port_id": port_id}

    @staticmethod
    def _free_port_id() -> int:
        taken = {int(p.name) for p in (NVMET / "ports").iterdir() if p.name.isdigit()}
        return next(i for i in range(1, 1000) if i not in taken)

    def untarget(self) -> dict[str, Any]:
        removed = []
        for record in list(self.state.data["targets"]):
            remove_target(record)
            self.state.drop("targets", record)
            removed.append(record["nqn"])
        return {"removed": removed}

    # -- the host ------------------------------------------------------------------------------

    def connect(self, address: str, nqn: str, hostnqn: str, port: int = 4420, keep_alive: int = 30,
                ctrl_loss: int = 5, reconnect_delay: int = 1, queues: int = 1,
                deadline: float = 60.0) -> dict[str, Any]:
        if shutil.which("nvme") is None:
            raise CallFailed("connect", errno.ENOENT, "no nvme-cli (nvme) on this host")
        self.state.add("connected", nqn)
        started = time.monotonic()
        run(["nvme", "connect", "-t", "rdma", "-a", address, "-s", str(port), "-n", nqn, f"--hostnqn={hostnqn}",
             f"--keep-alive-tmo={keep_alive}", f"--ctrl-loss-tmo={ctrl_loss}",
             f"--reconnect-delay={reconnect_delay}", f"--nr-io-queues={queues}"], timeout=deadline,
            call="nvme connect")
        controller, namespace = None, None
        until = started + deadline
        while time.monotonic() < until:
            controller, namespace = find(nqn)
            if namespace and Path(f"/dev/{namespace}").exists():
                break
            time.sleep(0.05)
        if not namespace:
            raise CallFailed("connect", errno.ENODEV, f"connected to {nqn}, but no namespace appeared within "
                                                      f"{deadline} s (controller {controller})")
        return {"controller": controller, "namespace": f"/dev/{namespace}",
                "seconds": round(time.monotonic() - started, 3)}

    def io(self, namespace: str, size: int, offset: int = 0, seed: int = 1) -> dict[str, Any]:
        if size <= 0 or size % BLOCK or offset % BLOCK:
            raise ValueError(f"direct I/O takes whole {BLOCK}-byte blocks: size {size}, offset {offset}")
        pattern = random.Random(seed).randbytes(size)
        buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
        try:
            buf[:] = pattern
            fd = os.open(namespace, os.O_RDWR | os.O_DIRECT)
            try:
                started = time.monotonic()
                written = os.pwritev(fd, [buf], offset)
                wrote = time.monotonic() - started
                buf[:] = bytes(size)
                started = time.monotonic()
                read = os.preadv(fd, [buf], offset)
                took = time.monotonic() - started
            finally:
                os.close(fd)
            equal = buf[:] == pattern
        except OSError as exc:
            raise CallFailed("io", exc.errno or 0, f"direct I/O of {size} bytes at {offset} on {namespace}: "
                                                   f"{exc.strerror}") from None
        finally:
            buf.close()
        return {"size": size, "offset": offset, "written": written, "read": read, "equal": equal,
                "write_seconds": round(wrote, 4), "read_seconds": round(took, 4)}

    def key_cycle(self, namespace: str, reads: int) -> dict[str, Any]:
        from hil.agent.rdma_netlink import read_resources

        def keys() -> dict[Any, Any]:
            return {e.get("mrn"): e.get("rkey") for e in read_resources(self.device, ("mr",)).get("mr", [])
                    if e.get("kern_name") == "nvme_rdma"}

        history: dict[Any, list[Any]] = {}
        buf = mmap.mmap(-1, BLOCK)
        fd = os.open(namespace, os.O_RDONLY | os.O_DIRECT)
        try:
            before = keys()
            if not any(key is not None for key in before.values()):
                raise CallFailed("key_cycle", 0, "the kernel's record shows no key of nvme_rdma's MRs")
            for done in range(1, reads + 1):
                os.preadv(fd, [buf], 0)
                now = keys()
                for mrn, key in now.items():
                    if key == before.get(mrn):
                        continue
                    seen = history.setdefault(mrn, [before.get(mrn)])
                    if key in seen:
                        return {"repeat": {"mrn": mrn, "key": key, "uses": len(seen)}, "reads": done,
                                "mrs_used": len(history)}
                    seen.append(key)
                before = now
        finally:
            os.close(fd)
            buf.close()
        return {"repeat": None, "reads": reads, "mrs_used": len(history),
                "most_uses": max((len(k) - 1 for k in history.values()), default=0)}

    def disconnect(self, nqn: str, deadline: float = STEP) -> dict[str, Any]:
        started = time.monotonic()
        said = run(["nvme", "disconnect", "-n", nqn], timeout=deadline, call="nvme disconnect")
        while find(nqn)[0] is not None:
            if time.monotonic() - started > deadline:
                raise CallFailed("disconnect", errno.ETIMEDOUT, f"{nqn}'s controller still there {deadline} s "
                                                                "after nvme disconnect")
            time.sleep(0.05)
        self.state.drop("connected", nqn)
        return {"said": said, "seconds": round(time.monotonic() - started, 3)}

    # -- the kernel's log ----------------------------------------------------------------------

    @staticmethod
    def _open_kmsg() -> int | None:
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(fd, 0, os.SEEK_END)
            return fd
        except OSError:
            return None

    def kmsg(self) -> list[str]:
        lines: list[str] = []
        if self._kmsg is None:
            return lines
        while len(lines) < 500:
            try:
                record = os.read(self._kmsg, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before it was read: go on with the next
                    continue
                break
            lines.append(record.split(";", 1)[-1].split("\n", 1)[0])
        return lines


def find(nqn: str) -> tuple[str | None, str | None]:
    """(controller, namespace block device) connected to ``nqn``, as sysfs lists them (a native multipath
    namespace is named after its subsystem)."""
    controller = None
    for ctrl in sorted(Path("/sys/class/nvme").glob("nvme*")):
        with contextlib.suppress(OSError):
            if (ctrl / "subsysnqn").read_text().strip() == nqn and (ctrl / "transport").read_text().strip() == "rdma":
                controller = ctrl.name
    if controller is None:
        return None, None
    for subsystem in Path("/sys/class/nvme-subsystem").glob("nvme-subsys*"):
        with contextlib.suppress(OSError):
            if (subsystem / "subsysnqn").read_text().strip() == nqn:
                for entry in sorted(subsystem.iterdir()):
                    if entry.name.startswith("nvme") and "n" in entry.name[4:] and "c" not in entry.name[4:]:
                        return controller, entry.name
    for entry in sorted(Path(f"/sys/class/nvme/{controller}").glob(f"{controller}n*")):
        return controller, entry.name
    return controller, None


def remove_target(record: dict[str, Any]) -> None:
    """One target's configfs entries, in the reverse order of their making; what is not there is skipped."""
    nqn = record["nqn"]
    subsystem = NVMET / "subsystems" / nqn
    if record.get("port_id") is not None:
        where = NVMET / "ports" / str(record["port_id"])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where / "subsystems" / nqn)
        with contextlib.suppress(FileNotFoundError):
            where.rmdir()
    namespace = subsystem / "namespaces" / "1"
    if namespace.exists():
        with contextlib.suppress(OSError):
            (namespace / "enable").write_text("0")
        namespace.rmdir()
    with contextlib.suppress(FileNotFoundError):
        subsystem.rmdir()
    nullb = NULLB / record["nullb"]
    if nullb.exists():
        with contextlib.suppress(OSError):
            (nullb / "power").write_text("0")
        nullb.rmdir()


def cleanup(state: State) -> list[str]:
    """Undo what the state file says was made: disconnect, remove targets, restore nvme-core's admin timeout,
    unload the modules the child loaded. Each step bounded; what failed is said, and the rest goes on."""
    said = []
    for nqn in list(state.data["connected"]):
        try:
            if find(nqn)[0] is not None:
                run(["nvme", "disconnect", "-n", nqn], call="nvme disconnect")
            state.drop("connected", nqn)
        except CallFailed as exc:
            said.append(str(exc))
    for record in list(state.data["targets"]):
        try:
            remove_target(record)
            state.drop("targets", record)
        except OSError as exc:
            said.append(f"removing target {record['nqn']}: {exc}")
    if state.data["admin_timeout"] is not None:
        with contextlib.suppress(OSError):
            (SYS_MODULE / "nvme_core" / "parameters" / "admin_timeout").write_text(state.data["admin_timeout"])
        state.data["admin_timeout"] = None
        state.save()
    for module in ("nvme_rdma", "nvmet_rdma", "nvmet", "null_blk"):
        if module in state.data["loaded"] and loaded(module):
            try:
                run(["modprobe", "-r", module], call=f"modprobe -r {module}")
                state.drop("loaded", module)
            except CallFailed as exc:
                said.append(str(exc))
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-san-nvme-fabric")
    parser.add_argument("--state", required=True, help="the file recording what was made")
    parser.add_argument("--address", help="this host's address on the lab network (a target serves on it)")
    parser.add_argument("--device", help="the RDMA device whose record key_cycle reads")
    parser.add_argument("--cleanup", action="store_true", help="undo what the state file records, and exit")
    args = parser.parse_args(argv)
    state = State(Path(args.state))
    if args.cleanup:
        problems = cleanup(state)
        print("\n".join(problems) or "nothing left")
        if not problems:
            with contextlib.suppress(OSError):
                os.unlink(args.state)
        return 1 if problems else 0
    server = Server(None, METHODS, own_stdout())
    if os.geteuid() != 0:
        server.refuse_to_start("the NVMe-oF driver must run as root (modprobe, configfs)")
        return 2
    server.calls = Fabric(state, args.address, args.device)
    server.hello({"program": "nvme", "state": args.state})
    server.serve(sys.stdin.buffer)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
