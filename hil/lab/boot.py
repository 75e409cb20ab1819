"""``lab up``: boot the lab's guests and write the inventory for them.

``up`` boots the guests in parallel, one thread each: start vng, wait for the guest's ready marker on its
console, then SSH with a short back-off until the RDMA device's port (rxe0, or siw0 with ``--provider siw``)
is ACTIVE. A guest that fails is stopped and booted once more (on TCG if it failed under KVM); a second
failure tears the whole lab down and shows that guest's console. Whatever goes wrong (or Ctrl-C), ``up``
leaves nothing running behind it. Before the guests: siw.ko for a siw lab (built once per kernel,
:mod:`hil.lab.siw`) and san_proxy.ko (built once per kernel and source, :mod:`hil.lab.proxy`),
KVM or TCG (a probe guest decides, remembered until the host reboots), the lab's keys, the guests' init
script and the Ethernet hub.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import hil
from hil.lab import LabError
from hil.lab.guest import (
    GUEST_INIT_SCRIPT,
    MAX_GUESTS,
    GuestSpec,
    console_tail,
    find_vng,
    lab_address,
    lab_mac,
    mgmt_mac,
    probe_kvm,
    read_marker,
    ready_fields,
    start_guest,
)
from hil.lab.inventory import host_configs, write_inventory
from hil.lab.kernel import DEFAULT_CACHE, DEFAULT_KERNEL, Kernel, fetch_kernel, kernel_choice
from hil.lab.keys import LabKeys, generate_keys, write_known_hosts
from hil.lab.layout import ALL, DEFAULT_LOW_MEMORY, low_memory, zone_summary, zones
from hil.lab.modules import BuiltModule
from hil.lab.procs import group_is_ours, group_members, stop_group, temp_files
from hil.lab.progress import Progress
from hil.lab.provider import DEFAULT_PROVIDER, provider
from hil.lab.proxy import MODULE as PROXY_MODULE
from hil.lab.proxy import NO_PROXY_HINT, san_proxy_module
from hil.lab.siw import MODULE, siw_module
from hil.lab.state import DEFAULT_STATE_DIR, GuestState, LabState
from hil.lab.teardown import _teardown

if TYPE_CHECKING:
    from hil.transport import Transport

__all__ = ["UpOptions", "up"]

HUB_PORT_FILE = "hub.port"
STAND_IN_HUGEPAGES = 32  # per guest, where the proxy is the userspace stand-in: contiguous memory, DMA buffers
HUB_LOG = "hub.log"
INIT_SCRIPT = "guest-init.sh"
INVENTORY = "lab.yaml"
KVM_PROBE = "kvm-probe.json"  # in the kernel cache: the probe costs its full timeout where KVM hangs


class _GuestFailed(Exception):
    """One boot attempt of one guest failed; the message says how."""


class _Cancelled(Exception):
    """The lab is being torn down while this guest boots."""


@dataclass(frozen=True)
class UpOptions:
    hosts: int = 2
    memory: str = "1G"
    hugepages: int | None = None  # 2 MiB hugetlb pages per guest, for the stand-in's P3-P5; None: 32 without
    # the proxy module, 0 with it (the module takes its blocks from the buddy allocator)
    state_dir: Path = DEFAULT_STATE_DIR
    inventory_out: Path | None = None  # default <state dir>/lab.yaml
    kernel_cache: Path = DEFAULT_CACHE
    accel: str = "auto"  # auto: probe KVM, use it only if a guest really runs; kvm; tcg
    boot_timeout: float = 300.0  # per attempt, until the ready marker (TCG boots take ~40-90 s here)
    ssh_timeout: float = 120.0  # per attempt, after the marker: SSH up and the RDMA port ACTIVE
    provider: str = DEFAULT_PROVIDER  # rxe or siw, in every guest (never both on one netdev)
    kernel: str = DEFAULT_KERNEL  # 6.1 (Debian 12) or 6.12 (Debian 13): hil.lab.kernel.KERNELS
    proxy_module: bool = True  # san_proxy.ko in every guest; False: the agent's userspace stand-in
    low_memory: str = DEFAULT_LOW_MEMORY  # RAM below 4 GiB, the rest above (NOLOWMEM); "all": qemu's layout

    @property
    def reserved_hugepages(self) -> int:
        if self.hugepages is not None:
            return self.hugepages
        return 0 if self.proxy_module else STAND_IN_HUGEPAGES

    @property
    def directory(self) -> Path:
        return self.state_dir.expanduser().absolute()

    @property
    def inventory(self) -> Path:
        return (self.inventory_out or self.directory / INVENTORY).expanduser().absolute()


def _free_ports(count: int) -> list[int]:
    # Held open together so that they differ; qemu binds them a moment later (a collision is a failed
    # boot, which is retried on fresh ports).
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _use_kvm(mode: str, kernel: Kernel, cache: Path, progress: Progress) -> bool:
    """KVM only if a probe guest really runs under it; the answer is kept until the host reboots."""
    if mode == "tcg":
        progress("host", "accelerator: TCG (asked for)")
        return False
    boot_id = _boot_id()
    known: object = None
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(cache.read_text())
    if isinstance(known, dict) and boot_id and known.get("boot_id") == boot_id:
        ok, why = bool(known.get("ok")), f"{known.get('why')}; probed earlier since this host booted"
    else:
        ok, why = probe_kvm(kernel.vmlinuz)
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"boot_id": boot_id, "ok": ok, "why": why}) + "\n")
    if mode == "kvm" and not ok:
        raise LabError(f"--accel kvm: {why}")
    progress("host", f"accelerator: {'KVM' if ok else 'TCG'} ({why})")
    return ok


def _start_hub(state: LabState, directory: Path) -> None:
    port_file = directory / HUB_PORT_FILE
    log = directory / HUB_LOG
    state.add_file(port_file)
    state.add_file(log)
    env = dict(os.environ)
    # The hub runs as `python -m hil.lab.hub` from wherever this hil package is, installed or not.
    root = str(Path(hil.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hil.lab.hub", "--port-file", str(port_file)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd="/")
    state.hub_pgid = proc.pid
    state.save()
    deadline = time.monotonic() + 15
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise LabError(f"the lab's Ethernet hub did not start:\n{console_tail(log, 10)}")
        time.sleep(0.05)
    state.hub_port = int(port_file.read_text())
    state.save()


class _Booter:
    """Boots the guests of one ``up``, each in its own thread."""

    def __init__(self, state: LabState, keys: LabKeys, kernel: Kernel, opts: UpOptions, kvm: bool,
                 progress: Progress) -> None:
        self.state = state
        self.keys = keys
        self.kernel = kernel
        self.opts = opts
        self.kvm = kvm
        self.progress = progress
        self.vng = find_vng()
        self.stop = threading.Event()
        self.lock = threading.Lock()  # state file and known_hosts
        self.errors: dict[str, BaseException] = {}
        self.device = provider(state.provider).device
        siw = Path(state.state_dir) / MODULE
        self.siw_module = siw if state.provider == "siw" else None
        self.proxy_module = Path(state.state_dir) / PROXY_MODULE if state.proxy_module else None
        self.low_memory = low_memory(opts.low_memory, opts.memory)

    def save(self) -> None:
        with self.lock:
            self.state.save()

    def boot_all(self) -> None:
        threads = [threading.Thread(target=self._guest, args=(g,), name=g.name, daemon=True)
                   for g in self.state.guests]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                if self.errors:
                    break  # one guest failed twice: no point waiting for the others
                for t in threads:
                    t.join(0.2)
        finally:
            self.stop.set()
            if self.errors or any(t.is_alive() for t in threads):
                # Stop the guests first, so threads blocked in an SSH connect fail fast, then let every
                # thread finish: none may start a guest after the teardown that follows.
                for g in self.state.guests:
                    if self._stop(g, grace=2):
                        self.progress(g.name, f"stopped (process group {g.pgid})")
                for t in threads:
                    t.join(60)
        if self.errors:
            name, exc = next(iter(self.errors.items()))
            raise exc if isinstance(exc, LabError) else LabError(f"{name}: {exc}")

    def _guest(self, guest: GuestState) -> None:
        try:
            self._bring_up(guest)
        except _Cancelled:
            pass
        except BaseException as exc:  # reported by boot_all in the main thread
            self.errors[guest.name] = exc

    def _bring_up(self, guest: GuestState) -> None:
        log = Path(guest.console_log)
        for attempt in (1, 2):
            guest.attempts = attempt
            kvm = self.kvm and attempt == 1  # a KVM guest that hangs past the probe gets TCG next time
            guest.accel = "kvm" if kvm else "tcg"
            try:
                self._boot_once(guest, kvm)
                return
            except _GuestFailed as exc:
                self._stop(guest)
                if attempt == 2 or self.stop.is_set():
                    raise LabError(
                        f"{guest.name} failed to boot twice: {exc}\n"
                        f"--- last lines of {guest.name}'s console ({log}) ---\n{console_tail(log)}"
                    ) from None
                failed = log.with_name(f"{guest.name}-console.failed.log")
                os.replace(log, failed)
                self.progress(guest.name, f"attempt 1 failed: {exc}; its console is in {failed}; retrying once")
                with self.lock:  # fresh port: the first one may have been taken under us
                    self.state.add_file(failed)
                    guest.ssh_port = _free_ports(1)[0]
                    write_known_hosts(self.keys, [g.ssh_port for g in self.state.guests])

    def _wait(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise _Cancelled

    def _boot_once(self, guest: GuestState, kvm: bool) -> None:
        assert self.state.hub_port is not None
        spec = GuestSpec(index=guest.index, ssh_port=guest.ssh_port, hub_port=self.state.hub_port,
                         vmlinuz=self.kernel.vmlinuz, init_script=Path(self.state.state_dir) / INIT_SCRIPT,
                         host_key=self.keys.host_key, authorized_keys=self.keys.client_pub,
                         memory=self.opts.memory, kvm=kvm, hugepages=self.opts.reserved_hugepages,
                         provider=self.state.provider, siw_module=self.siw_module,
                         proxy_module=self.proxy_module, low_memory=self.low_memory)
        log = Path(guest.console_log)
        proc = start_guest(spec, log, self.vng)
        guest.pgid = proc.pid
        guest.netdev = None
        self.save()
        if self.stop.is_set():  # torn down while we were starting it
            self._stop(guest)
            raise _Cancelled
        self.progress(guest.name, f"booting ({guest.accel.upper()}, vng pid {proc.pid}, "
                                  f"ssh 127.0.0.1:{guest.ssh_port}, console {log.name})")
        deadline = time.monotonic() + self.opts.boot_timeout
        while True:
            self._record_temp_files(guest)  # as soon as vng makes them: a boot stopped now leaves none
            marker = read_marker(log, guest.name)
            if marker is not None:
                ok, info = marker
                if not ok:
                    raise _GuestFailed(f"the guest's init failed: {info}")
                guest.netdev = info
                break
            if proc.poll() is not None:
                raise _GuestFailed(f"vng exited with status {proc.returncode} before the guest was ready")
            if time.monotonic() > deadline:
                raise _GuestFailed(f"no ready marker within {self.opts.boot_timeout:g} s")
            self._wait(0.5)
        self._record_temp_files(guest)
        self.save()  # the netdev
        proxy = ready_fields(log, guest.name).get("proxy")
        self.progress(guest.name, f"ready marker: sshd up, lab NIC {guest.netdev} {guest.lab_address}"
                                  f"{f', {proxy} loaded' if proxy else ''}")
        self._check_over_ssh(guest)

    def _record_temp_files(self, guest: GuestState) -> None:
        found = temp_files(guest.pgid) if guest.pgid is not None else []
        with self.lock:
            new = [path for path in found if path not in self.state.files]
            for path in new:
                self.state.add_file(path)
            if new:
                self.state.save()

    def _stop(self, guest: GuestState, grace: float = 5.0) -> bool:
        """Stop the guest's process group, recording vng's temp files first; whether it was running."""
        if guest.pgid is None or not group_members(guest.pgid):
            return False
        self._record_temp_files(guest)
        stop_group(guest.pgid, grace=grace)
        return True

    def _check_over_ssh(self, guest: GuestState) -> None:
        from hil.transport import TransportError, open_transport  # paramiko: only when booting

        host = next(h for h in host_configs(self.state, self.keys) if h.name == guest.name)
        deadline = time.monotonic() + self.opts.ssh_timeout
        delay, attempts, last = 1.0, 0, ""
        while True:  # sshd started a moment ago: back off briefly rather than hammer it
            self._wait(delay)
            attempts += 1
            try:
                transport = open_transport(host, ssh_config=None, connect_timeout=10, banner_timeout=20,
                                           auth_timeout=20, channel_timeout=20)
                break
            except TransportError as exc:
                last = exc.reason
            if time.monotonic() > deadline:
                raise _GuestFailed(f"no SSH within {self.opts.ssh_timeout:g} s ({attempts} tries): {last}")
            delay = min(delay * 2, 8.0)
        with transport:
            self.progress(guest.name, f"ssh root@127.0.0.1:{guest.ssh_port} answers (try {attempts})")
            state = ""
            while True:
                try:
                    result = transport.run(["cat", f"/sys/class/infiniband/{self.device}/ports/1/state"], timeout=30)
                    state = result.stdout.strip() or result.stderr.strip()
                except TransportError as exc:
                    state = exc.reason
                if state.partition(": ")[2] == "ACTIVE":  # sysfs says "4: ACTIVE"
                    break
                if time.monotonic() > deadline:
                    raise _GuestFailed(f"{self.device} port 1 not ACTIVE within {self.opts.ssh_timeout:g} s: {state}")
                self._wait(1.0)
            zoneinfo = self._run_checked(transport, ["cat", "/proc/zoneinfo"])
        self.progress(guest.name, f"{self.device} port 1 {state.partition(': ')[2]} on {guest.netdev}")
        self._check_zones(guest, zoneinfo)

    def _run_checked(self, transport: Transport, argv: list[str]) -> str:
        from hil.transport import TransportError

        try:
            result = transport.run(argv, timeout=30)
        except TransportError as exc:
            raise _GuestFailed(f"{' '.join(argv)}: {exc.reason}") from None
        if result.returncode:
            raise _GuestFailed(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-300:]}")
        return result.stdout

    def _check_zones(self, guest: GuestState, zoneinfo: str) -> None:
        """Say what each zone holds; with memory asked for above 4 GiB, a guest without it fails."""
        pages = zones(zoneinfo)
        summary = zone_summary(pages)
        self.progress(guest.name, f"zones: {summary}")
        if self.low_memory and not pages.get("Normal"):
            raise _GuestFailed(f"--low-memory {self.opts.low_memory} puts memory above 4 GiB, but the guest has "
                               f"no Normal zone (zones: {summary}): qemu's -machine max-ram-below-4g did not apply")


def up(opts: UpOptions, progress: Progress | None = None) -> LabState:
    """Boot the lab; on any failure (or Ctrl-C) everything started is stopped and removed again."""
    progress = progress or Progress()
    if not 1 <= opts.hosts <= MAX_GUESTS:
        raise LabError(f"--hosts must be 1..{MAX_GUESTS}, got {opts.hosts}")
    directory = opts.directory
    existing = LabState.load(directory)
    if existing is not None:
        alive = [pg for pg in existing.pgids if group_is_ours(pg, existing.state_dir)]
        if alive:
            raise LabError(f"a lab is already up in {directory} (process groups {alive}); "
                           f"`san-hil lab down --state-dir {directory}` first")
        progress("host", f"removing the remains of a lab that is no longer running in {directory}")
        _teardown(existing, progress)
    provider(opts.provider)  # an unknown one fails before anything is fetched or built
    choice = kernel_choice(opts.kernel)
    low = low_memory(opts.low_memory, opts.memory)
    find_vng()
    host = functools.partial(progress, "host")
    kernel = fetch_kernel(opts.kernel_cache, progress=host, choice=choice)
    siw = siw_module(kernel, opts.kernel_cache, progress=host) if opts.provider == "siw" else None
    proxy = _proxy_module(kernel, opts, host) if opts.proxy_module else None
    directory.mkdir(parents=True, exist_ok=True)
    state = LabState(state_dir=str(directory), kernel=str(kernel.vmlinuz), provider=opts.provider,
                     kernel_release=kernel.version, proxy_module=proxy is not None, low_memory=low or ALL)
    state.save()
    try:
        # the lab's own copies: a rebuild of the cache never changes them under the guests
        for built, name in ((siw, MODULE), (proxy, PROXY_MODULE)):
            if built is not None:
                state.add_file(directory / name)
                shutil.copyfile(built.path, directory / name)
        kvm = _use_kvm(opts.accel, kernel, opts.kernel_cache.expanduser() / KVM_PROBE, progress)
        keys = generate_keys(directory)
        for path in keys.files():
            state.add_file(path)
        init = directory / INIT_SCRIPT
        shutil.copyfile(GUEST_INIT_SCRIPT, init)
        init.chmod(0o755)
        state.add_file(init)
        _start_hub(state, directory)
        progress("host", f"Ethernet hub on 127.0.0.1:{state.hub_port} (pid {state.hub_pgid})")
        ports = _free_ports(opts.hosts)
        for index, port in enumerate(ports, start=1):
            console = directory / f"lab{index}-console.log"
            state.add_file(console)
            state.guests.append(GuestState(name=f"lab{index}", index=index, ssh_port=port, lab_mac=lab_mac(index),
                                           mgmt_mac=mgmt_mac(index), lab_address=lab_address(index),
                                           console_log=str(console)))
        write_known_hosts(keys, ports)
        state.save()
        _Booter(state, keys, kernel, opts, kvm, progress).boot_all()
        inventory = opts.inventory
        state.inventory = str(inventory)
        state.add_file(inventory)
        write_inventory(inventory, state, keys)
        state.ready = True
        state.save()
    except BaseException:
        progress("host", "stopping and removing what was started")
        _teardown(state, progress)
        raise
    progress("host", f"lab of {opts.hosts} ({opts.provider}, kernel {kernel.version}, "
                     f"{'san_proxy.ko' if proxy else 'proxy stand-in'}, low memory {low or ALL}) up in "
                     f"{progress.elapsed():.0f} s; inventory: {inventory}")
    return state


def _proxy_module(kernel: Kernel, opts: UpOptions, progress: Callable[[str], None]) -> BuiltModule:
    try:
        return san_proxy_module(kernel, opts.kernel_cache, progress)
    except LabError as exc:
        raise LabError(f"{exc}; {NO_PROXY_HINT}") from None
