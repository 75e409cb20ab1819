"""``san-hil lab up --provider siw``: siw.ko's build, cache and vermagic check, the siw guests' command line,
state and inventory, and (slow) siw0 in the guests of a running or freshly booted siw lab.

The cache tests use real modules and the real ``modinfo``: the lab kernel's own rdma_rxe.ko (from the
kernel cache ``san-hil lab up`` fills) stands in for a built siw.ko, and a copy with its vermagic changed
for a stale one. The real build (``make`` against the installed headers, ~20-100 s) and the lab test are
marked slow; the lab test uses ``SAN_LAB_INVENTORY`` when it names a running siw lab, and boots one of its
own with ``SAN_LAB_TESTS=1``::

    SAN_LAB_INVENTORY=/tmp/lab.yaml pytest tests/hil/lab/test_lab_siw.py -k guests
    SAN_LAB_TESTS=1 pytest tests/hil/lab/test_lab_siw.py
"""

from __future__ import annotations

import io
import json
import lzma
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from hil.cli.main import main
from hil.inventory import HostConfig, load_inventory
from hil.lab import LabError
from hil.lab.boot import UpOptions, up
from hil.lab.guest import GuestSpec, lab_mac, mgmt_mac, vng_command
from hil.lab.inventory import host_configs, write_inventory
from hil.lab.kernel import DEFAULT_CACHE, Kernel, find_kernel
from hil.lab.keys import generate_keys
from hil.lab.lab import status
from hil.lab.modules import _run as real_run
from hil.lab.siw import build_tree, debian_version, kernel_banner, siw_module, vermagic
from hil.lab.state import GuestState, LabState
from hil.measure import bandwidth
from tests.support.lab_hosts import INVENTORY_ENV

ROOT = Path(__file__).resolve().parents[3]
RELEASE = "6.1.0-57-amd64"
BANNER = f"{RELEASE} (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)"


def _bzimage(path: Path, banner: str) -> Path:
    """A file with an x86 boot protocol header whose kernel_version points at ``banner``."""
    data = bytearray(0x4000)
    data[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", data, 0x20E, 0x3000 - 0x200)
    data[0x3000 : 0x3000 + len(banner)] = banner.encode()
    path.write_bytes(bytes(data))
    return path


def _lab_kernel() -> Kernel:
    """The lab's cached kernel (its real rdma_rxe.ko); skip when `san-hil lab up` never fetched one here."""
    cache = DEFAULT_CACHE.expanduser()
    kernels = [k for k in (find_kernel(d) for d in sorted(cache.glob("*"))) if k is not None]
    if not kernels:
        pytest.skip(f"no lab kernel cached in {cache} (san-hil lab up fetches it)")
    if shutil.which("modinfo", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])) is None:
        pytest.skip("no modinfo (apt-get install kmod)")
    return kernels[-1]


def _kernel_in(tmp_path: Path, banner: str = BANNER) -> Kernel:
    """The lab kernel's real rdma_rxe.ko, with a bzImage of our own that says ``banner``."""
    real = _lab_kernel()
    return Kernel(real.version, real.root, _bzimage(tmp_path / f"vmlinuz-{real.version}", banner), real.modules,
                  real.rxe_module)


def _other_vermagic(module: Path, to: Path) -> Path:
    """A copy of ``module`` whose vermagic names another kernel release (same length: still a valid module)."""
    data = module.read_bytes()
    if module.suffix == ".xz":  # trixie's modules (the 6.12 kernel) are compressed
        data = lzma.decompress(data)
    release = vermagic(module).split()[0]  # 6.1.0-57-amd64
    other = "9" * len(release)
    assert b"vermagic=" + release.encode() in data
    to.write_bytes(data.replace(b"vermagic=" + release.encode(), b"vermagic=" + other.encode()))
    return to


class _Tools:
    """Runs tar and modinfo for real; answers dpkg-query with the packages given, and stands in for ``make``
    by copying ``built`` where kbuild would leave siw.ko."""

    def __init__(self, installed: dict[str, str], built: Path | None = None) -> None:
        self.installed = installed
        self.built = built
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv[0])
        if argv[0] == "dpkg-query":
            out = "".join(f"{name} ii  {self.installed[name]}\n" for name in argv[4:] if name in self.installed)
            return subprocess.CompletedProcess(list(argv), 0 if out else 1, out, "")
        if argv[0] == "make":
            source = Path(next(a for a in argv if a.startswith("M=")).removeprefix("M="))
            if self.built is None:
                return subprocess.CompletedProcess(list(argv), 2, "", "siw_main.c:1: error: the test says no")
            shutil.copyfile(self.built, source / "siw.ko")
            return subprocess.CompletedProcess(list(argv), 0, "  LD [M]  siw.ko\n", "")
        return real_run(argv, cwd)


def _series(release: str) -> str:
    return ".".join(release.split(".")[:2])


def _installed(release: str, version: str = "6.1.192-3") -> dict[str, str]:
    return {f"linux-headers-{release}": version, f"linux-source-{_series(release)}": version}


def _source_tree(root: Path, release: str = RELEASE) -> Path:
    """A /usr/src with linux-headers-<release>/Makefile and a linux-source tarball holding siw's folder."""
    series = _series(release)
    (root / f"linux-headers-{release}").mkdir(parents=True)
    (root / f"linux-headers-{release}" / "Makefile").write_text("# kbuild\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in (("siw/Makefile", "obj-$(CONFIG_RDMA_SIW) += siw.o\n"), ("siw/siw_main.c", "/* siw */\n"),
                           ("rxe/Makefile", "not unpacked\n")):
            data = text.encode()
            info = tarfile.TarInfo(f"linux-source-{series}/drivers/infiniband/sw/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (root / f"linux-source-{series}.tar.xz").write_bytes(lzma.compress(buf.getvalue()))
    return root


INSTALLED = _installed(RELEASE)


# --- the kernel's version, and vermagic ----------------------------------------------------------------


def test_debian_version_from_the_bzimage_header(tmp_path: Path) -> None:
    image = _bzimage(tmp_path / "vmlinuz", BANNER)
    assert kernel_banner(image) == BANNER
    assert debian_version(image) == "6.1.192-3"
    assert debian_version(_bzimage(tmp_path / "plain", "6.1.0 (me@home) #1 SMP")) is None  # not a Debian build
    (tmp_path / "elf").write_bytes(b"\x7fELF" + bytes(0x300))
    assert kernel_banner(tmp_path / "elf") is None and kernel_banner(tmp_path / "missing") is None


def test_the_cached_lab_kernel_says_its_debian_version() -> None:
    kernel = _lab_kernel()
    banner = kernel_banner(kernel.vmlinuz)
    assert banner is not None and banner.startswith(f"{kernel.version} ")
    assert debian_version(kernel.vmlinuz) is not None


def test_vermagic_is_what_modinfo_says(tmp_path: Path) -> None:
    kernel = _lab_kernel()
    magic = vermagic(kernel.rxe_module)
    assert magic.startswith(f"{kernel.version} ") and "modversions" in magic
    other = vermagic(_other_vermagic(kernel.rxe_module, tmp_path / "old.ko"))
    assert other != magic and other.endswith(magic.partition(" ")[2])
    (tmp_path / "junk.ko").write_bytes(b"not an ELF file")
    with pytest.raises(LabError, match=r"modinfo cannot read .*junk\.ko"):
        vermagic(tmp_path / "junk.ko")


# --- building and caching --------------------------------------------------------------------------------


def test_build_needs_headers_and_source_at_the_kernels_version(tmp_path: Path) -> None:
    src = _source_tree(tmp_path / "src")
    tree = build_tree(RELEASE, "6.1.192-3", src, _Tools(INSTALLED))
    assert tree.headers == src / f"linux-headers-{RELEASE}" and tree.tarball == src / "linux-source-6.1.tar.xz"
    older = {**INSTALLED, "linux-source-6.1": "6.1.190-1"}
    with pytest.raises(LabError) as exc:
        build_tree(RELEASE, "6.1.192-3", src, _Tools(older))
    assert "lab kernel's version 6.1.192-3; installed: linux-source-6.1 6.1.190-1" in str(exc.value)
    assert (f"apt-get install --no-install-recommends linux-headers-{RELEASE}=6.1.192-3 "
            "linux-source-6.1=6.1.192-3") in str(exc.value)
    with pytest.raises(LabError, match=f"installed: linux-headers-{RELEASE} not installed, linux-source-6.1 not"):
        build_tree(RELEASE, "6.1.192-3", src, _Tools({}))
    (src / "linux-source-6.1.tar.xz").unlink()
    with pytest.raises(LabError, match=r"linux-source-6.1.tar.xz missing; as root: apt-get install"):
        build_tree(RELEASE, "6.1.192-3", src, _Tools(INSTALLED))


def test_built_once_then_reused_while_its_vermagic_matches(tmp_path: Path) -> None:
    kernel = _kernel_in(tmp_path)
    src = _source_tree(tmp_path / "src", kernel.version)
    installed = _installed(kernel.version)
    cache = tmp_path / "cache"
    tools = _Tools(installed, built=kernel.rxe_module)  # "built": a real module with the kernel's vermagic
    lines: list[str] = []
    module = siw_module(kernel, cache, lines.append, tools, src)
    assert module.path == cache / "siw" / kernel.version / "siw.ko" and module.path.is_file()
    assert module.vermagic == vermagic(kernel.rxe_module) and module.debian_version == "6.1.192-3"
    assert tools.calls.count("make") == 1 and "building (not built yet)" in lines[0]
    record = json.loads((module.path.parent / ".complete").read_text())
    assert record["debian_version"] == "6.1.192-3" and record["vermagic"] == module.vermagic
    assert sorted(p.name for p in module.path.parent.iterdir()) == [".complete", "build.log", "siw.ko"]
    assert sorted(p.name for p in (cache / "siw").iterdir()) == [kernel.version]  # no staging left

    again = _Tools(installed, built=None)  # a build now would fail
    assert siw_module(kernel, cache, lines.append, again, src) == module
    assert "make" not in again.calls and "tar" not in again.calls and "cached in" in lines[-1]

    # the lab kernel moved on to another Debian version: built again for it, headers of that version wanted
    newer = _kernel_in(tmp_path, BANNER.replace("6.1.192-3", "6.1.193-1"))
    with pytest.raises(LabError, match=r"at the lab kernel's version 6\.1\.193-1"):
        siw_module(newer, cache, lines.append, again, src)
    assert "make" not in again.calls and module.path.is_file()  # the old build is kept until a new one succeeds


def test_a_stale_cache_is_rebuilt_and_a_mismatched_build_refused(tmp_path: Path) -> None:
    kernel = _kernel_in(tmp_path)
    src = _source_tree(tmp_path / "src", kernel.version)
    installed = _installed(kernel.version)
    folder = tmp_path / "cache" / "siw" / kernel.version
    folder.mkdir(parents=True)
    stale = _other_vermagic(kernel.rxe_module, folder / "siw.ko")
    stale_magic = vermagic(stale)
    (folder / ".complete").write_text(json.dumps({"debian_version": "6.1.192-3", "vermagic": stale_magic}))

    # headers that do not fit the kernel build a module the kernel would refuse: an error naming both
    tools = _Tools(installed, built=stale)
    with pytest.raises(LabError) as exc:
        siw_module(kernel, tmp_path / "cache", lambda m: None, tools, src)
    assert f"vermagic {stale_magic!r}" in str(exc.value)
    assert f"{kernel.rxe_module.name} has {vermagic(kernel.rxe_module)!r}" in str(exc.value)
    assert sorted(p.name for p in folder.parent.iterdir()) == [kernel.version]  # the attempt left nothing

    lines: list[str] = []
    module = siw_module(kernel, tmp_path / "cache", lines.append, _Tools(installed, built=kernel.rxe_module), src)
    assert f"its vermagic {stale_magic!r} differs from the lab kernel's" in lines[0]
    assert vermagic(module.path) == vermagic(kernel.rxe_module)

    failing = _Tools(installed, built=None)
    (folder / ".complete").unlink()
    with pytest.raises(LabError) as failed:
        siw_module(kernel, tmp_path / "cache", lambda m: None, failing, src)
    # one line: the compiler's first error and where the whole log is kept
    log = folder.with_name(f"{kernel.version}.build-failed.log")
    assert str(failed.value) == (f"building siw.ko against {src / f'linux-headers-{kernel.version}'} failed (exit 2): "
                                 f"siw_main.c:1: error: the test says no; the full log: {log}")
    assert "the test says no" in log.read_text()


@pytest.mark.slow
def test_the_real_build_against_the_installed_headers(tmp_path: Path) -> None:
    kernel = _lab_kernel()
    version = debian_version(kernel.vmlinuz)
    try:
        build_tree(kernel.version, version)
    except LabError as exc:
        pytest.skip(f"headers or source not installed (sh hil/lab/install.sh): {exc}")
    began = time.monotonic()
    module = siw_module(kernel, tmp_path, lambda m: None)
    took = time.monotonic() - began
    info = real_run(["modinfo", "-F", "name", str(module.path)], None).stdout.strip()
    depends = real_run(["modinfo", "-F", "depends", str(module.path)], None).stdout.strip().split(",")
    assert info == "siw" and vermagic(module.path) == vermagic(kernel.rxe_module)
    assert "libcrc32c" in depends and "ib_core" in depends  # why the guests modprobe libcrc32c before insmod
    print(f"siw.ko built in {took:.0f} s")


# --- the guests' command line, state, inventory and status -----------------------------------------------


def _spec(tmp_path: Path, provider: str) -> GuestSpec:
    return GuestSpec(index=1, ssh_port=40022, hub_port=40100, vmlinuz=tmp_path / "vmlinuz",
                     init_script=tmp_path / "guest-init.sh", host_key=tmp_path / "host",
                     authorized_keys=tmp_path / "pub", hugepages=8, provider=provider,
                     siw_module=tmp_path / "siw.ko" if provider == "siw" else None)


def test_siw_guests_are_told_to_load_the_labs_siw_ko(tmp_path: Path) -> None:
    def exec_args(provider: str) -> list[str]:
        argv = vng_command(_spec(tmp_path, provider))
        return shlex.split(argv[argv.index("--exec") + 1])

    rxe, siw = exec_args("rxe"), exec_args("siw")
    assert rxe[-1] == "8"  # rxe's command line is the one it always was: the script defaults to rxe
    assert siw == [*rxe, "siw", str(tmp_path / "siw.ko")]


def _state(tmp_path: Path, provider: str) -> LabState:
    state = LabState(state_dir=str(tmp_path), hub_port=40100, kernel="/k/vmlinuz", provider=provider)
    for i in (1, 2):
        state.guests.append(GuestState(name=f"lab{i}", index=i, ssh_port=40020 + i, lab_mac=lab_mac(i),
                                       mgmt_mac=mgmt_mac(i), lab_address=f"10.77.0.{i}",
                                       console_log=str(tmp_path / f"lab{i}-console.log"), netdev="eth1"))
    return state


def test_a_siw_labs_inventory_drives_siw0_at_gid_index_0(tmp_path: Path) -> None:
    keys = generate_keys(tmp_path)
    path = tmp_path / "lab.yaml"
    write_inventory(path, _state(tmp_path, "siw"), keys)
    hosts = load_inventory(path).select("san")
    assert [(h.device, h.gid_index, h.netdev) for h in hosts] == [("siw0", 0, "eth1")] * 2
    assert "lab up --provider siw" in path.read_text()
    assert host_configs(_state(tmp_path, "siw"), keys) == hosts
    assert [(h.device, h.gid_index) for h in host_configs(_state(tmp_path, "rxe"), keys)] == [("rxe0", 1)] * 2


def test_the_state_records_the_provider_and_status_shows_it(tmp_path: Path) -> None:
    state = _state(tmp_path, "siw")
    state.save()
    assert LabState.load(tmp_path) == state
    out = io.StringIO()
    assert status(tmp_path, out=out) == 1  # nothing runs
    assert out.getvalue().startswith(f"lab in {tmp_path}: 2 guests (siw), started ")
    # a state file written before there was a choice is an rxe lab
    raw = json.loads((tmp_path / "state.json").read_text())
    del raw["provider"]
    (tmp_path / "state.json").write_text(json.dumps(raw))
    loaded = LabState.load(tmp_path)
    assert loaded is not None and loaded.provider == "rxe"


def test_cli_provider_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    import hil.lab.lab as lab

    seen: list[UpOptions] = []
    monkeypatch.setattr(lab, "up", lambda opts: seen.append(opts))
    assert main(["lab", "up", "--hosts", "2", "--provider", "siw", "--state-dir", str(tmp_path)]) == 0
    assert main(["lab", "up", "--state-dir", str(tmp_path)]) == 0
    assert [o.provider for o in seen] == ["siw", "rxe"]
    with pytest.raises(SystemExit):
        main(["lab", "up", "--provider", "mlx5"])
    assert "invalid choice: 'mlx5'" in capsys.readouterr().err
    with pytest.raises(LabError, match="unknown provider 'mlx5': the lab boots rxe, siw"):
        up(UpOptions(provider="mlx5", state_dir=tmp_path / "never"))
    assert not (tmp_path / "never").exists()


# --- siw0 in the guests (slow) ---------------------------------------------------------------------------


def _san_hil(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hil.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def siw_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[HostConfig]]:
    """The san hosts of a running siw lab (SAN_LAB_INVENTORY), or of one booted here (SAN_LAB_TESTS=1)."""
    named = os.environ.get(INVENTORY_ENV)
    if named:
        hosts = load_inventory(Path(named)).select("san")
        if len(hosts) < 2 or any(h.device != "siw0" for h in hosts):
            pytest.skip(f"{INVENTORY_ENV}={named} is not a siw lab of two guests (san-hil lab up --provider siw)")
        yield hosts
        return
    if os.environ.get("SAN_LAB_TESTS") != "1":
        pytest.skip(f"needs a siw lab: {INVENTORY_ENV}=<its inventory>, or SAN_LAB_TESTS=1 to boot one (minutes)")
    state_dir = tmp_path_factory.mktemp("siw-lab") / "state"
    result = _san_hil("lab", "up", "--hosts", "2", "--provider", "siw", "--state-dir", str(state_dir),
                      timeout=1800)
    print(result.stdout, result.stderr, sep="\n")
    try:
        assert result.returncode == 0, result.stderr
        yield load_inventory(state_dir / "lab.yaml").select("san")
    finally:
        down = _san_hil("lab", "down", "--state-dir", str(state_dir), timeout=120)
        assert down.returncode == 0, down.stderr
        assert not state_dir.exists()


class _Host:
    """What bandwidth.measure_ib_write_bw uses of an Agent (its host, transport and capabilities: what a siw
    host's agent declares), without the agent."""

    capabilities = frozenset({"verbs", "iwarp"})

    def __init__(self, host: HostConfig) -> None:
        from hil.transport import open_transport

        self.host = host
        self.transport = open_transport(host, ssh_config=None)


@pytest.mark.slow
def test_siw_lab_guests_have_siw0_and_no_rxe0(siw_hosts: list[HostConfig]) -> None:
    from hil.transport import open_transport

    for host in siw_hosts:
        with open_transport(host, ssh_config=None) as t:
            links = json.loads(t.run(["rdma", "-j", "link", "show"], timeout=60).stdout)
            assert [(link["ifname"], link["netdev"], link["state"]) for link in links] == \
                [("siw0", host.netdev, "ACTIVE")], links  # one provider per lab: no rxe0 on any NIC
            info = t.run(["ibv_devinfo", "-v", "-d", "siw0"], timeout=60).stdout
            assert "transport:\t\t\tiWARP" in info and "PORT_ACTIVE" in info, info
            gids = t.run(["sh", "-c", "cat /sys/class/infiniband/siw0/ports/1/gids/*"], timeout=60).stdout.split()
            assert [g for g in gids if g.strip("0:")] and gids[0].strip("0:"), gids  # GID 0 is set (MAC-based)
            rxe = t.run(["sh", "-c", "grep -c '^rdma_rxe ' /proc/modules || true"], timeout=60).stdout.strip()
            assert rxe == "0"  # not even loaded
            # TCP gives up on a vanished peer within seconds, not 15 minutes (test_lab_faults on iWARP).
            retries = t.run(["cat", "/proc/sys/net/ipv4/tcp_retries2"], timeout=60).stdout.strip()
            assert retries == "5", retries


@pytest.mark.slow
def test_ib_write_bw_through_rdma_cm_between_the_siw_guests(siw_hosts: list[HostConfig]) -> None:
    client, server = _Host(siw_hosts[0]), _Host(siw_hosts[1])
    try:
        # -R (RDMA CM, the only way iWARP connects) is added for an iWARP host, as benchmarks/lab.py relies on.
        rows = bandwidth.measure_ib_write_bw(cast(Any, client), cast(Any, server), ("-s", "65536", "-n", "200"),
                                             timeout=300)
    finally:
        client.transport.close()
        server.transport.close()
    assert [size for size, _ in rows] == [65536] and rows[0][1] > 0
    print(f"ib_write_bw -d siw0 -R -s 65536 -n 200: {rows[0][1] * 1000 / 8:.2f} MB/s")
