"""siw.ko for the lab kernel: built once from the distribution's kernel source and headers, then cached.

Debian builds its kernels without Soft-iWARP (``# CONFIG_RDMA_SIW is not set``), but siw is in mainline
and builds out of tree in seconds (LAB.md): the siw folder of ``linux-source-<series>`` at the lab
kernel's exact Debian version, ``make M=... CONFIG_RDMA_SIW=m modules`` against the matching
``linux-headers-<release>``. For the host's own kernel series (6.1 on Debian 12) those are the host's
installed packages; for another Debian release's kernel (6.12: trixie) they are unpacked into a build root
of that release and make runs there (:mod:`hil.tools.lab.buildroot`). The module is cached in
``<kernel cache>/siw/<release>/`` and used only while its vermagic equals that of the lab kernel's own modules
(rdma_rxe.ko's) and it was built for the same Debian version; otherwise it is built again. It is unsigned:
loading it taints the guest kernel (harmless).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hil.tools.lab import LabError
from hil.tools.lab.apt import Apt
from hil.tools.lab.buildroot import build_root, dependencies, in_root, unpack_packages
from hil.tools.lab.kernel import Kernel
from hil.tools.lab.tools import find_tool

__all__ = ["SRC_ROOT", "BuildTree", "SiwModule", "build_tree", "debian_version", "kernel_banner", "siw_module",
           "suite_tree", "vermagic"]

SRC_ROOT = Path("/usr/src")  # where linux-headers-* and linux-source-*.tar.xz install
SIW_DIR = "drivers/infiniband/sw/siw"
MODULE = "siw.ko"
_COMPLETE = ".complete"  # JSON, written last: what the module was built from and its vermagic

Runner = Callable[[Sequence[str], Path | None], subprocess.CompletedProcess[str]]


def _which(tool: str) -> str | None:
    return find_tool(tool)  # PATH, beside the running interpreter, then sbin


def _run(argv: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = _which(argv[0])
    if tool is None:
        raise LabError(f"{argv[0]} not found: building siw.ko needs it (as root: sh hil/tools/lab/install.sh)")
    return subprocess.run([tool, *argv[1:]], cwd=cwd, capture_output=True, text=True, check=False, timeout=900)


@dataclass(frozen=True)
class SiwModule:
    path: Path
    vermagic: str
    release: str  # the kernel's modules folder name, e.g. 6.1.0-57-amd64
    debian_version: str | None  # e.g. 6.1.192-3; None if the kernel does not say


@dataclass(frozen=True)
class BuildTree:
    """The installed headers and source tarball siw.ko is built from, at the lab kernel's version."""

    headers: Path  # /usr/src/linux-headers-<release> (on this host: under ``root``)
    tarball: Path  # /usr/src/linux-source-<series>.tar.xz
    packages: tuple[str, str]  # linux-headers-<release>, linux-source-<series>
    root: Path = Path("/")  # where make runs: the host itself, or a build root (chroot) of another release

    def inside(self, path: Path) -> str:
        """``path`` (on this host, under ``root``) as make sees it."""
        return "/" + path.relative_to(self.root).as_posix() if self.root != Path("/") else str(path)

    def command(self, argv: Sequence[str]) -> list[str]:
        return list(argv) if self.root == Path("/") else in_root(self.root, argv)


def kernel_banner(vmlinuz: Path) -> str | None:
    """The version string of an x86 bzImage ("6.1.0-57-amd64 (...) #1 SMP ... Debian 6.1.192-3 (...)").

    The boot protocol's setup header points at it (``kernel_version`` at 0x20e, plus 0x200), uncompressed:
    what ``file`` prints, read without decompressing the kernel.
    """
    try:
        with vmlinuz.open("rb") as f:
            head = f.read(0x10000)
    except OSError:
        return None
    if len(head) < 0x210 or head[0x202:0x206] != b"HdrS":
        return None
    (pointer,) = struct.unpack_from("<H", head, 0x20E)
    start = pointer + 0x200
    if not pointer or start >= len(head):
        return None
    text = head[start:].split(b"\0", 1)[0].decode("ascii", "replace")
    return text or None


def debian_version(vmlinuz: Path) -> str | None:
    """The Debian package version the kernel was built as (``6.1.192-3``), from its banner."""
    banner = kernel_banner(vmlinuz)
    match = re.search(r"\bDebian (\S+)", banner or "")
    return match.group(1) if match else None


def vermagic(module: Path, run: Runner = _run) -> str:
    """``modinfo -F vermagic``: what the kernel compares before it loads a module."""
    result = run(["modinfo", "-F", "vermagic", str(module)], None)
    if result.returncode or not result.stdout.strip():
        raise LabError(f"modinfo cannot read {module}: {(result.stderr or result.stdout).strip()[-400:]}")
    return result.stdout.strip()


def _series(release: str) -> str:
    return ".".join(release.split(".")[:2])  # 6.1.0-57-amd64 -> 6.1


def _installed(packages: Sequence[str], run: Runner) -> dict[str, str | None]:
    result = run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev} ${Version}\\n", *packages], None)
    found: dict[str, str | None] = dict.fromkeys(packages)
    for line in result.stdout.splitlines():
        name, _, rest = line.partition(" ")
        status, _, version = rest.strip().partition(" ")
        if name in found and status.startswith("ii"):
            found[name] = version.strip() or None
    return found


def build_tree(release: str, version: str | None, src_root: Path = SRC_ROOT, run: Runner = _run) -> BuildTree:
    """The headers and source for ``release``; LabError naming what to install when they are missing or
    of another Debian version than the kernel's."""
    series = _series(release)
    packages = (f"linux-headers-{release}", f"linux-source-{series}")
    tree = BuildTree(src_root / packages[0], src_root / f"{packages[1]}.tar.xz", packages)
    wanted = "" if version is None else f"={version}"
    install = (f"as root: apt-get install --no-install-recommends {packages[0]}{wanted} {packages[1]}{wanted} "
               "(or sh hil/tools/lab/install.sh)")
    if version is not None:
        installed = _installed(packages, run)
        wrong = [f"{name} {have or 'not installed'}" for name, have in installed.items() if have != version]
        if wrong:
            raise LabError(f"siw.ko is built from {' and '.join(packages)} at the lab kernel's version {version}; "
                           f"installed: {', '.join(wrong)}; {install}")
    missing = [str(p) for p in (tree.headers / "Makefile", tree.tarball) if not p.is_file()]
    if missing:
        raise LabError(f"siw.ko is built from {' and '.join(packages)}: {', '.join(missing)} missing; {install}")
    return tree


def suite_tree(release: str, version: str | None, suite: str, cache: Path, progress: Callable[[str], None],
               run: Runner = _run) -> BuildTree:
    """The headers and source for ``release`` of Debian ``suite``, unpacked at ``version`` into that suite's
    build root (made on first use)."""
    if version is None:
        raise LabError(f"the {release} kernel does not say which Debian version it is (its banner has no "
                       "'Debian X'): siw.ko's headers and source cannot be matched to it")
    root = build_root(suite, cache, progress, run)
    series = _series(release)
    apt = Apt.for_suite(suite, cache)
    apt.prepare(run, progress, f"the {series} build root")
    headers = f"linux-headers-{release}"
    # the headers' own -common and the kbuild tools, at the same version (one source package builds them)
    wanted = [headers, *dependencies(apt, headers, version, r"linux-(?:headers|kbuild)-[a-z0-9.+~-]+", run),
              f"linux-source-{series}"]
    unpack_packages(root, apt, wanted, version, progress, run)
    tree = BuildTree(root / "usr/src" / headers, root / "usr/src" / f"linux-source-{series}.tar.xz",
                     (headers, f"linux-source-{series}"), root)
    missing = [str(p) for p in (tree.headers / "Makefile", tree.tarball) if not p.is_file()]
    if missing:
        raise LabError(f"the {suite} build root {root} lacks {', '.join(missing)} after unpacking "
                       f"{', '.join(wanted)} {version}")
    return tree


def _cached(folder: Path, want: str, version: str | None, run: Runner) -> tuple[SiwModule | None, str]:
    """The usable cached module, or None and why not."""
    module = folder / MODULE
    try:
        record = json.loads((folder / _COMPLETE).read_text())
    except (OSError, ValueError):
        return None, "not built yet"
    if not isinstance(record, dict) or not module.is_file():
        return None, "the cache holds no complete build"
    if version is not None and record.get("debian_version") != version:
        return None, f"built for Debian {record.get('debian_version')}, the lab kernel is {version}"
    have = vermagic(module, run)
    if have != want:
        return None, f"its vermagic {have!r} differs from the lab kernel's {want!r}"
    return SiwModule(module, have, folder.name, version), ""


def siw_module(kernel: Kernel, cache: Path, progress: Callable[[str], None] = print, run: Runner = _run,
               src_root: Path = SRC_ROOT) -> SiwModule:
    """siw.ko for ``kernel``, from ``<cache>/siw/<release>/`` or built there first.

    Used only if its vermagic equals rdma_rxe.ko's (the lab kernel's own module); a stale cache is built
    again, a fresh build that still differs is a LabError naming both.
    """
    want = vermagic(kernel.rxe_module, run)
    version = debian_version(kernel.vmlinuz)
    folder = cache.expanduser() / "siw" / kernel.version
    module, why = _cached(folder, want, version, run)
    if module is not None:
        progress(f"siw.ko for {kernel.version}: cached in {folder} (vermagic {want})")
        return module
    if kernel.suite is None:
        tree = build_tree(kernel.version, version, src_root, run)
    else:
        tree = suite_tree(kernel.version, version, kernel.suite, cache, progress, run)
    where = "" if tree.root == Path("/") else f" in the build root {tree.root}"
    progress(f"siw.ko for {kernel.version}: building ({why}) from {tree.tarball.name} and {tree.headers.name}"
             f"{f' {version}' if version else ''}{where}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{kernel.version}.partial-", dir=folder.parent))
    try:
        built = _build(tree, staging, run)
        have = vermagic(built, run)
        if have != want:
            raise LabError(f"siw.ko built from {tree.headers} has vermagic {have!r}, but the lab kernel's "
                           f"{kernel.rxe_module.name} has {want!r}: the headers do not match the kernel "
                           f"{kernel.vmlinuz}")
        record = {"release": kernel.version, "debian_version": version, "vermagic": have,
                  "built_from": [str(tree.headers), str(tree.tarball)], "build_root": str(tree.root)}
        (staging / _COMPLETE).write_text(json.dumps(record, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp's 0700 would hide it from other users' labs
        if folder.exists():
            shutil.rmtree(folder)  # stale, or half made
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"siw.ko for {kernel.version}: built into {folder} (vermagic {want})")
    return SiwModule(folder / MODULE, want, kernel.version, version)


def _build(tree: BuildTree, staging: Path, run: Runner) -> Path:
    """Unpack the siw folder of the source tarball, build it (in the build root, if any); the module, moved
    into ``staging``."""
    top = tree.tarball.name.removesuffix(".tar.xz")  # the tarball's one top folder: linux-source-6.1
    work = staging if tree.root == Path("/") else Path(tempfile.mkdtemp(prefix="siw-", dir=tree.root / "tmp"))
    try:
        result = run(["tar", "-xJf", str(tree.tarball), "-C", str(work), "--wildcards", f"{top}/{SIW_DIR}/*"], None)
        source = work / top / SIW_DIR
        if result.returncode or not (source / "Makefile").is_file():
            raise LabError(f"cannot unpack {SIW_DIR} from {tree.tarball}: {result.stderr.strip()[-600:]}")
        jobs = str(os.cpu_count() or 1)
        result = run(tree.command(["make", "-C", tree.inside(tree.headers), f"M={tree.inside(source)}",
                                   "CONFIG_RDMA_SIW=m", f"-j{jobs}", "modules"]), None)
        (staging / "build.log").write_text(result.stdout + result.stderr)
        built = source / MODULE
        if result.returncode or not built.is_file():
            tail = (result.stderr or result.stdout).strip()[-1200:]
            raise LabError(f"building siw.ko against {tree.headers} failed (exit {result.returncode}):\n{tail}")
        module = staging / MODULE
        shutil.move(str(built), str(module))
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work / top)  # the sources and objects: only the module is kept
        if work != staging:
            shutil.rmtree(work, ignore_errors=True)
    return module
