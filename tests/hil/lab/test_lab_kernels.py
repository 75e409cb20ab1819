"""``san-hil lab up --kernel 6.1|6.12``: the trixie apt source beside the host's, the 6.12 kernel, siw.ko built
in a trixie build root, and the kernel release in the lab's state, status and inventory.

The fast tests stand in for apt-get, mmdebstrap, dpkg-deb and make (recording what each is asked, so the test
sees that the host's apt state is never named); the slow ones read Debian's real trixie lists and build the
real siw.ko for 6.12 in a real build root (as root, network to deb.debian.org, a few minutes the first time)::

    pytest -m slow tests/hil/lab/test_lab_kernels.py
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from hil.cli.main import main
from hil.lab import LabError
from hil.lab.apt import HOST_APT, Apt
from hil.lab.boot import UpOptions
from hil.lab.buildroot import dependencies
from hil.lab.kernel import DEFAULT_CACHE, KERNELS, Kernel, fetch_kernel, kernel_choice
from hil.lab.lab import status
from hil.lab.proxy import san_proxy_module
from hil.lab.siw import siw_module, vermagic
from hil.lab.state import GuestState, LabState

RELEASE = "6.12.117+deb13-amd64"
VERSION = "6.12.117-1"
DEPENDS = (f"Package: linux-headers-{RELEASE}\nVersion: {VERSION}\nDepends: linux-base (>= 4.12~), "
           f"linux-headers-6.12.117+deb13-common (= {VERSION}), linux-image-{RELEASE} (= {VERSION}) | "
           f"linux-image-{RELEASE}-unsigned (= {VERSION}), linux-kbuild-6.12.117+deb13, gcc-14\n")


class _Tools:
    """apt-get, apt-cache, mmdebstrap, dpkg-deb, tar, modinfo and chroot's make, as far as the lab uses them;
    every argv is kept."""

    def __init__(self, tmp: Path, image: str = f"linux-image-{RELEASE}") -> None:
        self.tmp = tmp
        self.image = image
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        out, tool = "", argv[0]
        if tool == "apt-get" and argv[-1] == "update":
            lists = Path(_option(argv, "Dir::State::Lists"))
            (lists / "deb.debian.org_debian_dists_trixie_main_binary-amd64_Packages").write_text("Package: x\n")
        elif tool == "apt-cache" and "depends" in argv:
            out = f"linux-image-amd64\n  Depends: {self.image}\n"
        elif tool == "apt-cache" and "show" in argv:
            out = DEPENDS
        elif tool == "apt-get" and "download" in argv:
            assert cwd is not None
            for spec in argv[argv.index("download") + 1:]:
                (cwd / f"{spec.partition('=')[0]}_{VERSION}_amd64.deb").write_bytes(b"deb")
        elif tool == "dpkg-deb":
            self._unpack(Path(argv[2]).name.partition("_")[0], Path(argv[3]))
        elif tool == "mmdebstrap":
            (Path(argv[-2]) / "tmp").mkdir(parents=True)
        elif tool == "tar":
            source = Path(argv[argv.index("-C") + 1]) / "linux-source-6.12/drivers/infiniband/sw/siw"
            source.mkdir(parents=True)
            (source / "Makefile").write_text("obj-$(CONFIG_RDMA_SIW) += siw.o\n")
        elif tool == "chroot":
            root, make = Path(argv[1]), argv[argv.index("make"):]
            source = root / next(a for a in make if a.startswith("M=")).removeprefix("M=/")
            module = "san_proxy.ko" if source.name == "san_proxy" else "siw.ko"
            (source / module).write_bytes(b"module")
            out = f"  LD [M]  {module}\n"
        elif tool == "modinfo":
            out = f"{RELEASE} SMP preempt mod_unload modversions\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    def _unpack(self, package: str, into: Path) -> None:
        if package.startswith("linux-image-"):
            modules = into / "usr/lib/modules" / RELEASE
            rxe = modules / "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz"
            rxe.parent.mkdir(parents=True)
            rxe.write_bytes(b"rxe")
            (into / "boot").mkdir()
            _bzimage(into / "boot" / f"vmlinuz-{RELEASE}")
        elif package == f"linux-headers-{RELEASE}":
            (into / "usr/src" / package).mkdir(parents=True)
            (into / "usr/src" / package / "Makefile").write_text("include ...-common/Makefile\n")
        elif package == "linux-source-6.12":
            (into / "usr/src").mkdir(parents=True, exist_ok=True)
            (into / "usr/src/linux-source-6.12.tar.xz").write_bytes(b"xz")

    def tools(self) -> list[str]:
        return [c[0] for c in self.calls]


def _option(argv: Sequence[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(f"{name}="))


def _bzimage(path: Path) -> None:
    banner = f"{RELEASE} (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian {VERSION} (2026-11-12)"
    data = bytearray(0x4000)
    data[0x202:0x206] = b"HdrS"
    data[0x20E:0x210] = (0x3000 - 0x200).to_bytes(2, "little")
    data[0x3000:0x3000 + len(banner)] = banner.encode()
    path.write_bytes(bytes(data))


# --- apt: the host's, or trixie beside it -----------------------------------------------------------------


def test_the_host_apt_has_no_options_and_a_suite_has_folders_of_its_own(tmp_path: Path) -> None:
    assert HOST_APT.argv("apt-cache", "depends", "x") == ["apt-cache", "depends", "x"]
    apt = Apt.for_suite("trixie", tmp_path)
    argv = apt.argv("apt-get", "update")
    state = tmp_path / "apt" / "trixie"
    assert _option(argv, "Dir::Etc::sourcelist") == str(state / "sources.list")
    assert _option(argv, "Dir::Etc::sourceparts") == "-"  # /etc/apt/sources.list.d is not read
    assert _option(argv, "Dir::State::Lists") == str(state / "lists")
    assert _option(argv, "Dir::Cache") == str(state / "cache")
    assert _option(argv, "Dir::State::status") == str(state / "status")  # the host's dpkg status neither
    assert not any("/etc/apt" in a or "/var/lib/apt" in a or "/var/cache/apt" in a for a in argv)


def test_a_suites_lists_are_read_once_a_day(tmp_path: Path) -> None:
    apt, tools, lines = Apt.for_suite("trixie", tmp_path), _Tools(tmp_path), []
    apt.prepare(tools, lines.append)
    state = tmp_path / "apt" / "trixie"
    assert (state / "sources.list").read_text() == ("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                                                    "http://deb.debian.org/debian trixie main\n")
    assert (state / "status").read_text() == ""
    assert [c[-1] for c in tools.calls] == ["update"]
    assert lines == [f"reading Debian trixie's package lists into {state / 'lists'} (the host's own apt is not "
                     "touched)"]
    apt.prepare(tools, lines.append)
    assert len(tools.calls) == 1  # fresh: not read again
    stamp = state / "updated"
    os.utime(stamp, (stamp.stat().st_atime - 2 * 86400, stamp.stat().st_mtime - 2 * 86400))
    apt.prepare(tools, lines.append)
    assert len(tools.calls) == 2  # two days old: read again


def test_a_failed_update_uses_yesterdays_lists_or_says_why(tmp_path: Path) -> None:
    def failing(argv: Sequence[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(argv), 100, "", "E: Could not resolve 'deb.debian.org'")

    apt, lines = Apt.for_suite("trixie", tmp_path), []
    with pytest.raises(LabError, match=r"cannot read Debian trixie's package lists .*Could not resolve"):
        apt.prepare(failing, lines.append)
    apt.prepare(_Tools(tmp_path), lines.append)
    (tmp_path / "apt" / "trixie" / "updated").unlink()
    apt.prepare(failing, lines.append)  # lists from before: used, with a warning
    assert lines[-1].startswith("reading Debian trixie's package lists failed (apt-get update), using those of an "
                                "earlier day: E: Could not resolve")


def test_progress_says_what_the_lists_are_read_for(tmp_path: Path) -> None:
    """Not 'host: Debian trixie: reading its package lists' (on a bookworm host it read as if the host were
    trixie): what is read, whose, and what for."""
    tools, lines = _Tools(tmp_path), []
    Apt.for_suite("trixie", tmp_path).prepare(tools, lines.append, "the 6.12 build root")
    assert lines[0].startswith("reading Debian trixie's package lists for the 6.12 build root into ")
    lines.clear()
    fetch_kernel(tmp_path / "k", lines.append, _Tools(tmp_path / "k"), KERNELS["6.12"])
    assert lines[0].startswith("reading Debian trixie's package lists for the 6.12 lab kernel into ")
    assert not any(line.startswith("Debian trixie:") for line in lines), lines


# --- the kernel -----------------------------------------------------------------------------------------


def test_kernel_choices() -> None:
    assert sorted(KERNELS) == ["6.1", "6.12"]
    assert KERNELS["6.1"].suite is None and KERNELS["6.12"].suite == "trixie"
    with pytest.raises(LabError, match=r"unknown kernel '6.6': the lab boots 6.1 or 6.12"):
        kernel_choice("6.6")


def test_the_612_kernel_comes_from_trixie_without_the_hosts_apt(tmp_path: Path) -> None:
    tools, lines = _Tools(tmp_path), []
    kernel = fetch_kernel(tmp_path, lines.append, tools, KERNELS["6.12"])
    assert (kernel.version, kernel.suite) == (RELEASE, "trixie")
    assert kernel.rxe_module.name == "rdma_rxe.ko.xz"  # trixie's modules are xz-compressed
    assert kernel.vmlinuz == tmp_path / RELEASE / "boot" / f"vmlinuz-{RELEASE}"
    apt_calls = [c for c in tools.calls if c[0] in ("apt-get", "apt-cache")]
    assert [c[c.index("APT::Sandbox::User=root") + 1:] for c in apt_calls] == [
        ["update"], ["depends", "linux-image-amd64"], ["download", f"linux-image-{RELEASE}"]]
    assert all(_option(c, "Dir::State::Lists") == str(tmp_path / "apt/trixie/lists") for c in apt_calls)
    assert any(f"downloading linux-image-{RELEASE} from Debian trixie" in line for line in lines)
    # cached: the next lab reads the lists it has and downloads nothing
    again = _Tools(tmp_path)
    assert fetch_kernel(tmp_path, lines.append, again, KERNELS["6.12"]) == kernel
    assert again.tools() == ["apt-cache"]


def test_a_kernel_of_another_series_is_refused(tmp_path: Path) -> None:
    tools = _Tools(tmp_path, image="linux-image-6.1.0-57-amd64")
    with pytest.raises(LabError, match=r"--kernel 6.12: linux-image-amd64 in Debian trixie is linux-image-6.1.0-57-"
                                       r"amd64, not the 6.12 kernel of Debian 13 \(trixie\)"):
        fetch_kernel(tmp_path, lambda m: None, tools, KERNELS["6.12"])
    assert "download" not in [a for c in tools.calls for a in c]
    host = _Tools(tmp_path, image=f"linux-image-{RELEASE}")  # a trixie host's own apt, asked for 6.1
    with pytest.raises(LabError, match=r"--kernel 6.1: linux-image-amd64 in the host's apt sources is linux-image-"
                                       r"6.12.117\+deb13-amd64, not the 6.1 kernel of Debian 12"):
        fetch_kernel(tmp_path, lambda m: None, host, KERNELS["6.1"])


# --- siw.ko for 6.12: a trixie build root ----------------------------------------------------------------


def test_the_headers_own_packages_are_read_from_their_depends(tmp_path: Path) -> None:
    found = dependencies(Apt.for_suite("trixie", tmp_path), f"linux-headers-{RELEASE}", VERSION,
                         r"linux-(?:headers|kbuild)-[a-z0-9.+~-]+", _Tools(tmp_path))
    assert found == ["linux-headers-6.12.117+deb13-common", "linux-kbuild-6.12.117+deb13"]  # not the image


@pytest.mark.skipif(os.geteuid() != 0, reason="the build root is made and entered as root")
def test_siw_for_612_is_built_in_a_trixie_root(tmp_path: Path) -> None:
    tools, lines = _Tools(tmp_path), []
    kernel = fetch_kernel(tmp_path, lines.append, tools, KERNELS["6.12"])
    tools.calls.clear()
    module = siw_module(kernel, tmp_path, lines.append, tools)
    root = tmp_path / "buildroot" / "trixie"
    assert module.path == tmp_path / "siw" / RELEASE / "siw.ko" and module.debian_version == VERSION
    mmdebstrap = next(c for c in tools.calls if c[0] == "mmdebstrap")
    assert mmdebstrap[1:3] == ["--variant=essential", "--include=gcc-14,make,pahole,libelf1t64,libssl3t64,zlib1g,perl"]
    download = next(c for c in tools.calls if "download" in c)
    assert download[download.index("download") + 1:] == [
        f"linux-headers-{RELEASE}={VERSION}", f"linux-headers-6.12.117+deb13-common={VERSION}",
        f"linux-kbuild-6.12.117+deb13={VERSION}", f"linux-source-6.12={VERSION}"]
    assert all(c[-1] == str(root) for c in tools.calls if c[0] == "dpkg-deb")  # unpacked into the root only
    make = next(c for c in tools.calls if c[0] == "chroot")
    assert make[:2] == ["chroot", str(root)]
    assert make[make.index("make"):][:3] == ["make", "-C", f"/usr/src/linux-headers-{RELEASE}"]  # the root's paths
    assert [a for a in make if a.startswith("M=/tmp/siw-")]
    assert list((root / "tmp").iterdir()) == []  # the sources and the debs are gone again
    assert any("in the build root" in line for line in lines)
    # the next lab: the module cached, the root not even looked at
    again = _Tools(tmp_path)
    assert siw_module(kernel, tmp_path, lines.append, again) == module
    assert again.tools() == ["modinfo", "modinfo"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the build root is made and entered as root")
def test_san_proxy_for_612_needs_only_the_headers_in_the_root(tmp_path: Path) -> None:
    tools, lines = _Tools(tmp_path), list[str]()
    kernel = fetch_kernel(tmp_path, lines.append, tools, KERNELS["6.12"])
    tools.calls.clear()
    module = san_proxy_module(kernel, tmp_path, lines.append, tools)
    root = tmp_path / "buildroot" / "trixie"
    assert module.path.parent.parent == tmp_path / "san_proxy" / RELEASE and module.debian_version == VERSION
    download = next(c for c in tools.calls if "download" in c)
    assert download[download.index("download") + 1:] == [  # no linux-source: san_proxy needs no kernel source
        f"linux-headers-{RELEASE}={VERSION}", f"linux-headers-6.12.117+deb13-common={VERSION}",
        f"linux-kbuild-6.12.117+deb13={VERSION}"]
    make = next(c for c in tools.calls if c[0] == "chroot")
    assert make[:2] == ["chroot", str(root)] and "W=1" in make
    assert [a for a in make if a.startswith("M=/tmp/san_proxy-")]
    assert list((root / "tmp").iterdir()) == []
    assert any("build root for san_proxy.ko: making it with mmdebstrap" in line for line in lines)
    # siw.ko later: only the source is unpacked in addition, the headers are there at that version
    tools.calls.clear()
    siw_module(kernel, tmp_path, lines.append, tools)
    download = next(c for c in tools.calls if "download" in c)
    assert download[download.index("download") + 1:] == [f"linux-source-6.12={VERSION}"]
    assert "mmdebstrap" not in tools.tools()


@pytest.mark.skipif(os.geteuid() != 0, reason="the build root is made and entered as root")
def test_a_build_root_of_another_package_list_is_made_again(tmp_path: Path) -> None:
    from hil.lab.buildroot import build_root

    root = tmp_path / "buildroot" / "trixie"
    (root / "tmp").mkdir(parents=True)
    (root / "old-file").write_text("")
    (root / ".pytest-san-complete").write_text("mmdebstrap --variant=essential trixie: gcc-14 make\n")
    tools, lines = _Tools(tmp_path), list[str]()
    assert build_root("trixie", tmp_path, lines.append, tools, purpose="san_proxy.ko") == root
    assert lines[0] == (f"Debian trixie build root {root} was made with gcc-14 make; making it again with gcc-14 make "
                        "pahole libelf1t64 libssl3t64 zlib1g perl")
    assert tools.tools() == ["mmdebstrap"] and not (root / "old-file").exists()
    assert build_root("trixie", tmp_path, lines.append, tools) == root and tools.tools() == ["mmdebstrap"]


def test_san_proxy_for_612_as_a_user_says_it_needs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with the root made and the headers unpacked (by root, for an earlier source), make runs through chroot."""
    tools = _Tools(tmp_path)
    kernel = fetch_kernel(tmp_path, lambda m: None, tools, KERNELS["6.12"])
    root = tmp_path / "buildroot" / "trixie"
    (root / "tmp").mkdir(parents=True)
    (root / ".pytest-san-complete").write_text(
        "mmdebstrap --variant=essential trixie: gcc-14 make pahole libelf1t64 libssl3t64 zlib1g perl\n")
    (root / "var/lib/pytest-san").mkdir(parents=True)
    for package in (f"linux-headers-{RELEASE}", "linux-headers-6.12.117+deb13-common", "linux-kbuild-6.12.117+deb13"):
        (root / "var/lib/pytest-san" / package).write_text(VERSION + "\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match=r"building san_proxy.ko in the build root .* needs root .*cached"):
        san_proxy_module(kernel, tmp_path, lambda m: None, tools)
    assert "chroot" not in tools.tools()


def test_siw_for_612_as_a_user_says_it_needs_root_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = _Tools(tmp_path)
    kernel = fetch_kernel(tmp_path, lambda m: None, tools, KERNELS["6.12"])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match=r"making a Debian trixie build root for siw.ko needs root .*cached"):
        siw_module(kernel, tmp_path, lambda m: None, tools)


# --- the release in the state, status and inventory -----------------------------------------------------


def test_status_names_the_kernel(tmp_path: Path) -> None:
    state = LabState(state_dir=str(tmp_path), provider="siw", kernel_release=RELEASE)
    state.guests.append(GuestState(name="lab1", index=1, ssh_port=40021, lab_mac="m", mgmt_mac="m",
                                   lab_address="10.77.0.1", console_log=str(tmp_path / "c.log")))
    state.save()
    out = io.StringIO()
    assert status(tmp_path, out=out) == 1  # nothing runs
    assert out.getvalue().startswith(f"lab in {tmp_path}: 1 guests (siw, kernel {RELEASE}), started ")


def test_cli_kernel_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import hil.lab.lab as lab

    seen: list[UpOptions] = []
    monkeypatch.setattr(lab, "up", lambda opts: seen.append(opts))
    assert main(["lab", "up", "--kernel", "6.12", "--provider", "siw", "--state-dir", str(tmp_path)]) == 0
    assert main(["lab", "up", "--state-dir", str(tmp_path)]) == 0
    assert [(o.kernel, o.kernel_cache) for o in seen] == [("6.12", DEFAULT_CACHE), ("6.1", DEFAULT_CACHE)]
    with pytest.raises(SystemExit):
        main(["lab", "up", "--kernel", "6.6"])
    assert "argument --kernel: invalid choice: '6.6' (choose from '6.1', '6.12')" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # once, `--kernel 6.12` was this abbreviation: a cache in ./6.12
        main(["lab", "up", "--kernel-c", "6.12"])
    assert "abbreviations are not accepted: did you mean --kernel-cache?" in capsys.readouterr().err


# --- the real thing (slow) ------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_trixie_lists_name_a_612_kernel(tmp_path: Path) -> None:
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get")
    from hil.lab.kernel import _run, image_package

    apt = Apt.for_suite("trixie", tmp_path)
    apt.prepare(_run, print)
    package = image_package(run=_run, apt=apt)
    assert package.startswith("linux-image-6.12.") and package.endswith("+deb13-amd64")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the build root is made and entered as root")
def test_real_siw_for_612_loads_nowhere_but_matches_the_kernel() -> None:
    """The real build in the shared cache (what `lab up --kernel 6.12 --provider siw` does; minutes once)."""
    kernel: Kernel = fetch_kernel(DEFAULT_CACHE, print, choice=KERNELS["6.12"])
    module = siw_module(kernel, DEFAULT_CACHE, print)
    assert module.vermagic == vermagic(kernel.rxe_module) and module.vermagic.startswith(kernel.version + " ")
