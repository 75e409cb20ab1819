"""``san-hil lab up``'s proxy driver module and memory layout: san_proxy.ko's build and cache (by kernel release and
source digest), the guests' command line (``--proxy-ko``, ``-machine max-ram-below-4g``, ``swiotlb=noforce``),
``--low-memory``'s checks, the zones a guest reports, and the options in the state, status and CLI.

No VM and no compiler: ``make`` and ``modinfo`` are stood in for (a "module" is a text file saying its vermagic).
The real build against the installed headers is ``-m slow``; booting a lab with both is README's recipe
(``san-hil lab up --hosts 2``, then ``lsmod``, ``/proc/zoneinfo`` and ``/dev/san_proxy`` over ``lab ssh``).
"""

from __future__ import annotations

import io
import json
import shlex
import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

import hil.kmod
from hil.cli.main import main
from hil.lab import LabError
from hil.lab.boot import UpOptions, _proxy_module, up
from hil.lab.guest import GUEST_INIT_SCRIPT, READY_MARKER, GuestSpec, read_marker, ready_fields, vng_command
from hil.lab.kernel import Kernel
from hil.lab.lab import status
from hil.lab.layout import low_memory, size_mib, zone_summary, zones
from hil.lab.modules import first_error, warnings
from hil.lab.proxy import san_proxy_module
from hil.lab.state import GuestState, LabState

RELEASE = "6.1.0-57-amd64"
VERSION = "6.1.192-3"
MAGIC = f"{RELEASE} SMP preempt mod_unload modversions"
BANNER = f"{RELEASE} (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian {VERSION} (2026-11-26)"
HEADERS = f"linux-headers-{RELEASE}"


def _bzimage(path: Path, banner: str = BANNER) -> Path:
    data = bytearray(0x4000)
    data[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", data, 0x20E, 0x3000 - 0x200)
    data[0x3000 : 0x3000 + len(banner)] = banner.encode()
    path.write_bytes(bytes(data))
    return path


def _kernel(tmp_path: Path) -> Kernel:
    rxe = tmp_path / "kernel" / "rdma_rxe.ko"
    rxe.parent.mkdir(parents=True)
    rxe.write_text(f"vermagic={MAGIC}\n")
    return Kernel(RELEASE, tmp_path / "kernel", _bzimage(tmp_path / "kernel" / f"vmlinuz-{RELEASE}"),
                  tmp_path / "kernel", rxe)


def _sources(folder: Path, body: str = "int x;\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "san_proxy.c").write_text(f"/* the module */\n{body}")
    (folder / "san_proxy.h").write_text("#define SAN_PROXY_ABI 1\n")
    (folder / "Kbuild").write_text("obj-m := san_proxy.o\n")
    (folder / "Makefile").write_text("# for make -C\n")
    return folder


def _headers(src: Path) -> Path:
    (src / HEADERS).mkdir(parents=True)
    (src / HEADERS / "Makefile").write_text("# kbuild\n")
    return src


class _Tools:
    """dpkg-query answers from ``installed``; make leaves a "module" saying ``magic`` (or fails with ``log``);
    modinfo reads a module's vermagic back. Every argv, and the sources make found, are kept."""

    def __init__(self, installed: dict[str, str] | None = None, magic: str = MAGIC, log: str = "",
                 fail: bool = False) -> None:
        self.installed = {HEADERS: VERSION} if installed is None else installed
        self.magic, self.log, self.fail = magic, log, fail
        self.calls: list[list[str]] = []
        self.seen: dict[str, str] = {}  # what make found in its M= folder

    def __call__(self, argv: Sequence[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "dpkg-query":
            out = "".join(f"{name} ii  {self.installed[name]}\n" for name in argv[4:] if name in self.installed)
            return subprocess.CompletedProcess(argv, 0 if out else 1, out, "")
        if argv[0] == "make":
            folder = Path(next(a for a in argv if a.startswith("M=")).removeprefix("M="))
            self.seen = {p.name: p.read_text() for p in sorted(folder.iterdir())}
            if self.fail:
                return subprocess.CompletedProcess(argv, 2, "", self.log.replace("{M}", str(folder)))
            (folder / "san_proxy.ko").write_text(f"vermagic={self.magic}\n")
            log = self.log.replace("{M}", str(folder))
            return subprocess.CompletedProcess(argv, 0, "  LD [M]  san_proxy.ko\n", log)
        if argv[0] == "modinfo":
            text = Path(argv[-1]).read_text()
            return subprocess.CompletedProcess(argv, 0, text.partition("vermagic=")[2], "")
        raise AssertionError(f"unexpected {argv}")

    def makes(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "make"]


# --- the sources ------------------------------------------------------------------------------------------


def test_the_package_ships_the_sources_and_digests_them(tmp_path: Path) -> None:
    assert Path(hil.kmod.__file__).parent == hil.kmod.SOURCE_DIR
    assert hil.kmod.SOURCES == ("san_proxy.c", "san_proxy.h", "Kbuild")
    digest = hil.kmod.source_digest(_sources(tmp_path / "a"))
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert hil.kmod.source_digest(_sources(tmp_path / "b")) == digest  # same bytes, same key
    (tmp_path / "b" / "Makefile").write_text("# not what kbuild reads with M=\n")
    assert hil.kmod.source_digest(tmp_path / "b") == digest
    (tmp_path / "b" / "san_proxy.h").write_text("#define SAN_PROXY_ABI 2\n")
    assert hil.kmod.source_digest(tmp_path / "b") != digest
    assert hil.kmod.header_abi(tmp_path / "a") == 1 and hil.kmod.header_abi(tmp_path / "none") is None


# --- the build and its cache --------------------------------------------------------------------------------


def test_built_from_a_copy_with_w1_then_cached_by_release_and_digest(tmp_path: Path) -> None:
    kernel, src, source = _kernel(tmp_path), _headers(tmp_path / "src"), _sources(tmp_path / "kmod")
    cache, tools, lines = tmp_path / "cache", _Tools(), list[str]()
    module = san_proxy_module(kernel, cache, lines.append, tools, src, source)
    digest = hil.kmod.source_digest(source)
    folder = cache / "san_proxy" / RELEASE / digest
    assert module.path == folder / "san_proxy.ko" and module.vermagic == MAGIC and module.debian_version == VERSION
    (make,) = tools.makes()
    assert make[:3] == ["make", "-C", str(src / HEADERS)] and "W=1" in make and make[-1] == "modules"
    scratch = Path(next(a for a in make if a.startswith("M=")).removeprefix("M="))
    assert not scratch.is_relative_to(source) and not scratch.exists()  # a copy, never the package; gone again
    assert tools.seen == {name: (source / name).read_text() for name in hil.kmod.SOURCES}
    assert sorted(p.name for p in folder.iterdir()) == [".complete", "build.log", "san_proxy.ko"]
    assert sorted(p.name for p in (cache / "san_proxy" / RELEASE).iterdir()) == [digest]  # no staging left
    record = json.loads((folder / ".complete").read_text())
    assert record["key"] == digest and record["vermagic"] == MAGIC and record["debian_version"] == VERSION
    assert lines[0] == (f"san_proxy.ko for {RELEASE}: building (not built yet) from {source} (sources {digest}) "
                        f"and {HEADERS} {VERSION}")

    again = _Tools(fail=True)  # a build now would fail
    assert san_proxy_module(kernel, cache, lines.append, again, src, source) == module
    assert not again.makes() and lines[-1].startswith(f"san_proxy.ko for {RELEASE}: cached in {folder}")

    # an edited source is another key: built again beside the old one, which labs of that source keep
    (source / "san_proxy.c").write_text("/* edited */\n")
    edited = san_proxy_module(kernel, cache, lines.append, _Tools(), src, source)
    assert edited.path.parent.name == hil.kmod.source_digest(source) != digest
    assert module.path.is_file() and "building (not built yet)" in lines[-2]


def test_a_cached_module_of_another_vermagic_is_built_again(tmp_path: Path) -> None:
    kernel, src, source = _kernel(tmp_path), _headers(tmp_path / "src"), _sources(tmp_path / "kmod")
    cache = tmp_path / "cache"
    module = san_proxy_module(kernel, cache, lambda m: None, _Tools(), src, source)
    old = MAGIC.replace(RELEASE, "6.1.0-56-amd64")
    module.path.write_text(f"vermagic={old}\n")
    tools, lines = _Tools(), list[str]()
    rebuilt = san_proxy_module(kernel, cache, lines.append, tools, src, source)
    assert len(tools.makes()) == 1 and rebuilt.path == module.path and rebuilt.vermagic == MAGIC
    assert f"its vermagic {old!r} differs from the lab kernel's {MAGIC!r}" in lines[0]
    # headers that build for another kernel: refused, naming both, and nothing is cached
    module.path.write_text(f"vermagic={old}\n")
    with pytest.raises(LabError, match=r"has vermagic '6\.1\.0-56-amd64 .*', but the lab kernel's rdma_rxe\.ko has"):
        san_proxy_module(kernel, cache, lambda m: None, _Tools(magic=old), src, source)


def test_missing_headers_are_one_line_naming_the_package(tmp_path: Path) -> None:
    kernel, source = _kernel(tmp_path), _sources(tmp_path / "kmod")
    src = tmp_path / "src"
    with pytest.raises(LabError) as exc:
        san_proxy_module(kernel, tmp_path / "cache", lambda m: None, _Tools(installed={}), src, source)
    message = str(exc.value)
    assert "\n" not in message
    assert message == (f"san_proxy.ko for {RELEASE} is built from {HEADERS} at the lab kernel's version {VERSION}; "
                       f"installed: {HEADERS} not installed; as root: apt-get install --no-install-recommends "
                       f"{HEADERS}={VERSION} (or sh hil/lab/install.sh)")
    older = _Tools(installed={HEADERS: "6.1.190-1"})
    with pytest.raises(LabError, match=f"installed: {HEADERS} 6.1.190-1; as root: apt-get install"):
        san_proxy_module(kernel, tmp_path / "cache", lambda m: None, older, src, source)
    # installed by dpkg's account but its tree is gone
    with pytest.raises(LabError, match=rf"{src / HEADERS / 'Makefile'} missing; as root: apt-get install"):
        san_proxy_module(kernel, tmp_path / "cache", lambda m: None, _Tools(), src, source)
    # only the headers are asked for: no kernel source tarball
    assert "linux-source" not in message
    (source / "Kbuild").unlink()
    with pytest.raises(LabError, match=r"sources are incomplete: Kbuild missing in .*; or boot with --no-proxy"):
        san_proxy_module(kernel, tmp_path / "cache", lambda m: None, _Tools(), src, source)


COMPILER_LOG = """make: Entering directory '/usr/src/linux-headers-6.1.0-57-amd64'
  CC [M]  {M}/san_proxy.o
{M}/san_proxy.c: In function 'san_open':
{M}/san_proxy.c:12:5: warning: unused variable 'x' [-Wunused-variable]
{M}/san_proxy.c:40:9: error: implicit declaration of function 'pin_user_pages_fast'
{M}/san_proxy.c:41:1: error: expected ';' before '}' token
make[2]: *** [scripts/Makefile.build:250: {M}/san_proxy.o] Error 1
make: *** [Makefile:2009: {M}] Error 2
"""


def test_a_failed_build_says_its_first_error_and_keeps_the_log(tmp_path: Path) -> None:
    kernel, src, source = _kernel(tmp_path), _headers(tmp_path / "src"), _sources(tmp_path / "kmod")
    cache = tmp_path / "cache"
    tools = _Tools(log=COMPILER_LOG, fail=True)
    with pytest.raises(LabError) as exc:
        san_proxy_module(kernel, cache, lambda m: None, tools, src, source)
    digest = hil.kmod.source_digest(source)
    log = cache / "san_proxy" / RELEASE / f"{digest}.build-failed.log"
    assert str(exc.value) == (f"building san_proxy.ko against {src / HEADERS} failed (exit 2): san_proxy.c:40:9: "
                              "error: implicit declaration of function 'pin_user_pages_fast'; the full log: "
                              f"{log}")
    assert "expected ';'" in log.read_text()
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name]  # no module, no staging
    # the next good build removes it
    san_proxy_module(kernel, cache, lambda m: None, _Tools(), src, source)
    assert sorted(p.name for p in log.parent.iterdir()) == [digest]


def test_warnings_are_kept_and_said_not_fatal(tmp_path: Path) -> None:
    kernel, src, source = _kernel(tmp_path), _headers(tmp_path / "src"), _sources(tmp_path / "kmod")
    log = ("{M}/san_proxy.c:12:5: warning: unused variable 'x' [-Wunused-variable]\n"
           "WARNING: modpost: missing MODULE_DESCRIPTION() in {M}/san_proxy.o\n")
    lines: list[str] = []
    module = san_proxy_module(kernel, tmp_path / "cache", lines.append, _Tools(log=log), src, source)
    assert module.warnings == ("san_proxy.c:12:5: warning: unused variable 'x' [-Wunused-variable]",
                               "WARNING: modpost: missing MODULE_DESCRIPTION() in san_proxy.o")
    assert lines[-2] == (f"san_proxy.ko for {RELEASE}: 2 warnings (not fatal), the first: san_proxy.c:12:5: warning: "
                         f"unused variable 'x' [-Wunused-variable]; all in {module.path.parent / 'build.log'}")
    assert "warning: unused variable" in (module.path.parent / "build.log").read_text()


def test_first_error_of_other_failures() -> None:
    perl = ("make: Entering directory '/usr/src/linux-headers-6.12.117+deb13-amd64'\n  CC [M]  /tmp/s/san_proxy.o\n"
            "Can't locate Pod/Usage.pm in @INC (you may need to install the Pod::Usage module)\n"
            "make[2]: *** [Makefile.build:234: /tmp/s/san_proxy.o] Error 2\n")
    assert first_error(perl, "/tmp/s") == \
        "Can't locate Pod/Usage.pm in @INC (you may need to install the Pod::Usage module)"
    assert first_error("make: *** No rule to make target 'modules'.  Stop.\n") == \
        "make: *** No rule to make target 'modules'.  Stop."
    assert first_error("") == "no output"
    assert warnings("all fine\n") == ()


def test_a_proxy_build_failure_says_how_to_boot_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hil.lab.boot as boot

    def failing(*args: object) -> object:
        raise LabError("san_proxy.ko for 6.1.0-57-amd64 is built from linux-headers-6.1.0-57-amd64 ...")

    monkeypatch.setattr(boot, "san_proxy_module", failing)
    with pytest.raises(LabError, match=r"\.\.\.; or boot with --no-proxy-module \(the agent's userspace stand-in\)$"):
        _proxy_module(_kernel(tmp_path), UpOptions(), lambda m: None)


@pytest.mark.slow
def test_the_real_build_against_the_installed_headers(tmp_path: Path) -> None:
    """The package's own sources, built for the cached 6.1 lab kernel with the host's headers."""
    from hil.lab.kernel import DEFAULT_CACHE, find_kernel
    from hil.lab.modules import vermagic

    kernels = [k for k in (find_kernel(d) for d in sorted(DEFAULT_CACHE.expanduser().glob("6.1.*"))) if k]
    if not kernels or not (hil.kmod.SOURCE_DIR / "san_proxy.c").is_file():
        pytest.skip("no cached 6.1 lab kernel (san-hil lab up), or no san_proxy.c yet")
    try:
        module = san_proxy_module(kernels[-1], tmp_path, print)
    except LabError as exc:
        if "apt-get install" in str(exc):
            pytest.skip(f"headers not installed: {exc}")
        raise
    assert vermagic(module.path) == vermagic(kernels[-1].rxe_module)
    assert module.warnings == ()  # W=1 clean


# --- --low-memory -----------------------------------------------------------------------------------------


def test_sizes() -> None:
    assert [size_mib(s) for s in ("256M", "1G", "1g", "1GiB", "2048K", "64M")] == [256, 1024, 1024, 1024, 2, 64]
    assert [size_mib(s) for s in ("256", "1.5G", "M", "", "1000K")] == [None, None, None, None, None]
    assert size_mib("1024", bare="M") == 1024  # qemu's -m: a bare number is MiB


def test_low_memory_is_checked_against_memory() -> None:
    assert low_memory("256M", "1G") == "256M"
    assert low_memory("1G", "2G") == "1024M"
    assert low_memory("all", "1G") is None and low_memory("ALL", "768M") is None
    for value, memory, said in [
        ("lots", "1G", "--low-memory lots: not a size like 256M or 1G, nor `all`"),
        ("256", "1G", "--low-memory 256: not a size like 256M or 1G, nor `all`"),
        ("32M", "1G", "--low-memory 32M: at least 64M"),
        ("1G", "1G", "--low-memory 1G: below --memory 1G and 4G"),
        ("2G", "1G", "--low-memory 2G: below --memory 1G and 4G"),
        ("4G", "8G", "--low-memory 4G: below --memory 8G and 4G"),
        ("256M", "much", "--memory much: not a size like 1G or 768M (--low-memory 256M is checked against it)"),
    ]:
        with pytest.raises(LabError) as exc:
            low_memory(value, memory)
        assert str(exc.value).startswith(said), (value, memory, str(exc.value))


def test_a_bad_low_memory_fails_before_anything_is_made(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="--low-memory 16M: at least 64M"):
        up(UpOptions(low_memory="16M", state_dir=tmp_path / "never"))
    assert not (tmp_path / "never").exists()


ZONEINFO = """Node 0, zone      DMA
  per-node stats
      nr_inactive_anon 0
  pages free     3840
        min      27
        present  3998
        managed  3840
Node 0, zone    DMA32
  pages free     60000
        present  61407
        managed  61407
Node 0, zone   Normal
  pages free     150000
        present  196608
        managed  180183
Node 0, zone  Movable
  pages free     0
        present  0
        managed  0
"""


def test_zones_from_proc_zoneinfo() -> None:
    pages = zones(ZONEINFO)
    assert pages == {"DMA": 3998, "DMA32": 61407, "Normal": 196608, "Movable": 0}
    assert zone_summary(pages) == "DMA 16 MiB, DMA32 240 MiB, Normal 768 MiB"
    flat = zones(ZONEINFO.split("Node 0, zone   Normal")[0])
    assert "Normal" not in flat and zone_summary({}) == "none"


# --- the guests' command line, init script and marker -------------------------------------------------------


def _spec(tmp_path: Path, **kwargs: object) -> GuestSpec:
    return GuestSpec(index=1, ssh_port=40022, hub_port=40100, vmlinuz=tmp_path / "vmlinuz",
                     init_script=tmp_path / "guest-init.sh", host_key=tmp_path / "host",
                     authorized_keys=tmp_path / "pub", hugepages=8, **kwargs)  # type: ignore[arg-type]


def test_the_layout_on_the_vng_command_line(tmp_path: Path) -> None:
    plain = vng_command(_spec(tmp_path))
    assert not [a for a in plain if a.startswith("--append")] and "-machine" not in plain[-1]
    laid = vng_command(_spec(tmp_path, low_memory="256M"))
    assert "--append=swiotlb=noforce" in laid
    assert laid[-1].startswith("--qemu-opts=")  # still last, one token, no spaces inside an option's value
    tokens = laid[-1].removeprefix("--qemu-opts=").split(" ")
    assert tokens[-2:] == ["-machine", "max-ram-below-4g=256M"]  # merged by qemu with vng's own -machine q35
    assert [a for a in laid if a not in plain] == ["--append=swiotlb=noforce", laid[-1]]


def test_the_proxy_module_is_an_option_of_the_init_script(tmp_path: Path) -> None:
    def exec_args(**kwargs: object) -> list[str]:
        argv = vng_command(_spec(tmp_path, **kwargs))
        return shlex.split(argv[argv.index("--exec") + 1])

    plain, proxy = exec_args(), exec_args(proxy_module=tmp_path / "san_proxy.ko")
    boot = proxy.index("boot")
    assert proxy[boot - 2:boot] == ["--proxy-ko", str(tmp_path / "san_proxy.ko")]
    assert [a for a in proxy if a not in plain] == ["--proxy-ko", str(tmp_path / "san_proxy.ko")]
    assert "--proxy-ko" not in plain


def test_the_init_script_refuses_proxy_ko_without_a_path() -> None:
    argv = ["bash", str(GUEST_INIT_SCRIPT), "--ready", READY_MARKER, "--failed", "F", "--mgmt-cidr", "10.0.2.15/24",
            "--proxy-ko"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode != 0 and "usage" in done.stderr and "--proxy-ko KO" in done.stderr
    text = GUEST_INIT_SCRIPT.read_text()
    # loaded (and its device there) before the ready marker, which then says so
    lines = text.splitlines()
    loaded = next(i for i, line in enumerate(lines) if line.strip() == 'load_module "$PROXY_KO"')
    device = next(i for i, line in enumerate(lines) if line.strip().startswith("wait_file /dev/san_proxy"))
    ready = next(i for i, line in enumerate(lines) if line.strip().startswith('echo "$READY_MARKER'))
    assert loaded < device < ready and "${PROXY_KO:+ proxy=san_proxy}" in lines[ready]


def test_the_ready_marker_may_say_the_proxy(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    assert ready_fields(log, "lab1") == {}
    log.write_text(f"{READY_MARKER} lab1 netdev=enp0s10 mgmt=enp0s3 proxy=san_proxy\n")
    assert read_marker(log, "lab1") == (True, "enp0s10")
    assert ready_fields(log, "lab1") == {"netdev": "enp0s10", "mgmt": "enp0s3", "proxy": "san_proxy"}


# --- the options, the state and the status ------------------------------------------------------------------


def test_cli_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import hil.lab.lab as lab

    seen: list[UpOptions] = []
    monkeypatch.setattr(lab, "up", lambda opts: seen.append(opts))
    assert main(["lab", "up", "--state-dir", str(tmp_path)]) == 0
    assert main(["lab", "up", "--no-proxy-module", "--low-memory", "all", "--state-dir", str(tmp_path)]) == 0
    assert main(["lab", "up", "--proxy-module", "--low-memory", "512M", "--memory", "2G",
                 "--state-dir", str(tmp_path)]) == 0
    assert [(o.proxy_module, o.low_memory, o.memory) for o in seen] == [
        (True, "256M", "1G"), (False, "all", "1G"), (True, "512M", "2G")]


def test_state_and_status_say_the_proxy_and_the_layout(tmp_path: Path) -> None:
    state = LabState(state_dir=str(tmp_path), kernel_release=RELEASE, proxy_module=True, low_memory="256M")
    state.guests.append(GuestState(name="lab1", index=1, ssh_port=40021, lab_mac="m", mgmt_mac="m",
                                   lab_address="10.77.0.1", console_log=str(tmp_path / "c.log")))
    state.save()
    assert LabState.load(tmp_path) == state
    out = io.StringIO()
    status(tmp_path, out=out)
    assert out.getvalue().startswith(f"lab in {tmp_path}: 1 guests (rxe, kernel {RELEASE}, san_proxy.ko, low memory "
                                     "256M), started ")
    state.proxy_module, state.low_memory = False, "all"
    state.save()
    out = io.StringIO()
    status(tmp_path, out=out)
    assert f"(rxe, kernel {RELEASE}, proxy stand-in, low memory all)" in out.getvalue()
    # a lab booted before either was recorded says neither
    raw = json.loads((tmp_path / "state.json").read_text())
    del raw["proxy_module"], raw["low_memory"]
    (tmp_path / "state.json").write_text(json.dumps(raw))
    loaded = LabState.load(tmp_path)
    assert loaded is not None and (loaded.proxy_module, loaded.low_memory) == (None, None)
    out = io.StringIO()
    status(tmp_path, out=out)
    assert f"(rxe, kernel {RELEASE}), started" in out.getvalue()



def test_hugepages_are_reserved_for_the_stand_in_only_unless_asked() -> None:
    """The module takes its contiguous blocks from the buddy allocator: a lab with it reserves no hugetlb pages,
    one with the userspace stand-in 32 a guest (its contiguous memory); an explicit --hugepages wins."""
    from hil.lab.boot import STAND_IN_HUGEPAGES, UpOptions

    assert UpOptions().reserved_hugepages == 0
    assert UpOptions(proxy_module=False).reserved_hugepages == STAND_IN_HUGEPAGES == 32
    assert UpOptions(hugepages=4).reserved_hugepages == 4
    assert UpOptions(proxy_module=False, hugepages=0).reserved_hugepages == 0
