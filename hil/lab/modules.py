"""Out-of-tree modules for the lab kernel (siw.ko, san_proxy.ko): built one way, cached by kernel and source.

A module is built with ``make -C <headers> M=<folder> modules`` against ``linux-headers-<release>`` at the lab
kernel's exact Debian version, read from the kernel image's banner (``... Debian 6.1.192-3``). For the host's
own kernel series (6.1 on Debian 12) those are the host's installed packages under ``/usr/src``; for another
Debian release's kernel (6.12: trixie) they are unpacked into a build root of that release and make runs there
(:mod:`hil.lab.buildroot`). A build goes into a staging folder beside its cache folder and replaces it in
one rename once it is whole, with ``.complete`` (what it was built from, its vermagic) written last and the
build's log kept as ``build.log``. A cached module is used only while its vermagic equals that of the lab
kernel's own rdma_rxe.ko and it was built for the same Debian version; otherwise it is built again. The
modules are unsigned: loading one taints the guest kernel (harmless).
"""

from __future__ import annotations

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

from hil.lab import LabError
from hil.lab.apt import Apt
from hil.lab.buildroot import build_root, dependencies, in_root, need_root, unpack_packages
from hil.lab.kernel import Kernel
from hil.lab.tools import find_tool

__all__ = ["BUILD_LOG", "COMPLETE", "SRC_ROOT", "BuildTree", "BuiltModule", "OutOfTree", "build_module",
           "debian_version", "first_error", "host_tree", "kernel_banner", "suite_tree", "vermagic", "warnings"]

SRC_ROOT = Path("/usr/src")  # where linux-headers-* and linux-source-*.tar.xz install
COMPLETE = ".complete"  # JSON, written last: what the module was built from and its vermagic
BUILD_LOG = "build.log"
INSTALL_HINT = "(or sh hil/lab/install.sh)"

Runner = Callable[[Sequence[str], Path | None], subprocess.CompletedProcess[str]]


def _run(argv: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = find_tool(argv[0])  # PATH, beside the running interpreter, then sbin (modinfo)
    if tool is None:
        raise LabError(f"{argv[0]} not found: building the lab's kernel modules needs it "
                       "(as root: sh hil/lab/install.sh)")
    return subprocess.run([tool, *argv[1:]], cwd=cwd, capture_output=True, text=True, check=False, timeout=900)


@dataclass(frozen=True)
class BuiltModule:
    path: Path
    vermagic: str
    release: str  # the kernel's modules folder name, e.g. 6.1.0-57-amd64
    debian_version: str | None  # e.g. 6.1.192-3; None if the kernel does not say
    warnings: tuple[str, ...] = ()  # the compiler's and modpost's, from this build (none when cached)


@dataclass(frozen=True)
class BuildTree:
    """The installed headers (and, for a module from the kernel's own source, its tarball) at the lab kernel's
    version."""

    headers: Path  # /usr/src/linux-headers-<release> (on this host: under ``root``)
    packages: tuple[str, ...]  # linux-headers-<release>[, linux-source-<series>]
    root: Path = Path("/")  # where make runs: the host itself, or a build root (chroot) of another release
    tarball: Path | None = None  # /usr/src/linux-source-<series>.tar.xz, when asked for

    def inside(self, path: Path) -> str:
        """``path`` (on this host, under ``root``) as make sees it."""
        return "/" + path.relative_to(self.root).as_posix() if self.root != Path("/") else str(path)

    def command(self, argv: Sequence[str]) -> list[str]:
        return list(argv) if self.root == Path("/") else in_root(self.root, argv)


@dataclass(frozen=True)
class OutOfTree:
    """One module the lab builds: its file, its cache folder, and how its source folder is laid out for make."""

    module: str  # siw.ko
    cache_name: str  # <kernel cache>/<cache_name>/<release>[/<key>]/
    needs_source: bool  # the kernel's source tarball too (siw's folder comes from it), not only the headers
    stage: Callable[[BuildTree, Path, Runner], Path]  # puts the sources under a scratch folder; the M= folder
    origin: str  # what it is built from, for progress lines ("linux-source-6.1.tar.xz", "hil/kmod 0123abcd")
    make_args: tuple[str, ...] = ()  # CONFIG_RDMA_SIW=m, W=1
    key: str | None = None  # a cache level below the release: the sources' digest, so an edit builds again

    def folder(self, cache: Path, release: str) -> Path:
        base = cache.expanduser() / self.cache_name / release
        return base / self.key if self.key else base


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


def series(release: str) -> str:
    return ".".join(release.split(".")[:2])  # 6.1.0-57-amd64 -> 6.1


def _packages(release: str, needs_source: bool) -> tuple[str, ...]:
    headers = f"linux-headers-{release}"
    return (headers, f"linux-source-{series(release)}") if needs_source else (headers,)


def _installed(packages: Sequence[str], run: Runner) -> dict[str, str | None]:
    result = run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev} ${Version}\\n", *packages], None)
    found: dict[str, str | None] = dict.fromkeys(packages)
    for line in result.stdout.splitlines():
        name, _, rest = line.partition(" ")
        status, _, version = rest.strip().partition(" ")
        if name in found and status.startswith("ii"):
            found[name] = version.strip() or None
    return found


def host_tree(module: str, release: str, version: str | None, needs_source: bool, src_root: Path = SRC_ROOT,
              run: Runner = _run) -> BuildTree:
    """The host's headers (and source) for ``release``; a one-line LabError naming what to install when they
    are missing or of another Debian version than the kernel's."""
    packages = _packages(release, needs_source)
    tarball = src_root / f"{packages[1]}.tar.xz" if needs_source else None
    tree = BuildTree(src_root / packages[0], packages, tarball=tarball)
    wanted = "" if version is None else f"={version}"
    install = (f"as root: apt-get install --no-install-recommends {' '.join(p + wanted for p in packages)} "
               f"{INSTALL_HINT}")
    what = f"{module} for {release} is built from {' and '.join(packages)}"
    if version is not None:
        installed = _installed(packages, run)
        wrong = [f"{name} {have or 'not installed'}" for name, have in installed.items() if have != version]
        if wrong:
            raise LabError(f"{what} at the lab kernel's version {version}; installed: {', '.join(wrong)}; {install}")
    missing = [str(p) for p in (tree.headers / "Makefile", tree.tarball) if p is not None and not p.is_file()]
    if missing:
        raise LabError(f"{what}: {', '.join(missing)} missing; {install}")
    return tree


def suite_tree(module: str, release: str, version: str | None, suite: str, needs_source: bool, cache: Path,
               progress: Callable[[str], None], run: Runner = _run) -> BuildTree:
    """The headers (and source) for ``release`` of Debian ``suite``, unpacked at ``version`` into that suite's
    build root (made on first use)."""
    if version is None:
        raise LabError(f"the {release} kernel does not say which Debian version it is (its banner has no "
                       f"'Debian X'): {module}'s headers cannot be matched to it")
    root = build_root(suite, cache, progress, run, purpose=module)
    apt = Apt.for_suite(suite, cache)
    apt.prepare(run, progress, f"the {series(release)} build root")
    packages = _packages(release, needs_source)
    headers = packages[0]
    # the headers' own -common and the kbuild tools, at the same version (one source package builds them)
    wanted = [headers, *dependencies(apt, headers, version, r"linux-(?:headers|kbuild)-[a-z0-9.+~-]+", run),
              *packages[1:]]
    unpack_packages(root, apt, wanted, version, progress, run, purpose=module)
    need_root(f"building {module} in the build root {root}")  # chroot, even with everything unpacked already
    tarball = root / "usr/src" / f"{packages[1]}.tar.xz" if needs_source else None
    tree = BuildTree(root / "usr/src" / headers, packages, root, tarball)
    missing = [str(p) for p in (tree.headers / "Makefile", tree.tarball) if p is not None and not p.is_file()]
    if missing:
        raise LabError(f"the {suite} build root {root} lacks {', '.join(missing)} after unpacking "
                       f"{', '.join(wanted)} {version}")
    return tree


# gcc's "file:line[:col]: error: ..." (and "fatal error"); else a tool's complaint (a script kbuild runs: "Can't
# locate Pod/Usage.pm"); else make's own "*** ... Error 2", which only says that something failed
_ERROR = re.compile(r"^\S+?:\d+(?::\d+)?: (?:fatal )?error: .*$", re.MULTILINE)
_COMPLAINT = re.compile(r"^(?!make(?:\[\d+\])?: ).*(?:\berror\b|can't|cannot|not found|no such).*$",
                        re.MULTILINE | re.IGNORECASE)
_MAKE_ERROR = re.compile(r"^make(?:\[\d+\])?: \*\*\*.*$", re.MULTILINE)
# gcc's "file:line:col: warning: ..." and modpost's "WARNING: modpost: ..."
_WARNING = re.compile(r"^(?:\S+?:\d+(?::\d+)?: warning: .*|WARNING: .*)$", re.MULTILINE)


def _short(line: str, folder: str) -> str:
    return line.replace(folder.rstrip("/") + "/", "").strip()


def first_error(log: str, folder: str = "") -> str:
    """The build's first error line, with the scratch folder's path left out (``san_proxy.c:12:3: error: ...``)."""
    match = _ERROR.search(log) or _COMPLAINT.search(log) or _MAKE_ERROR.search(log)
    if match:
        return _short(match.group(0), folder)[:400]
    lines = [line for line in log.splitlines() if line.strip()]
    return _short(lines[-1], folder) if lines else "no output"


def warnings(log: str, folder: str = "") -> tuple[str, ...]:
    return tuple(_short(m.group(0), folder) for m in _WARNING.finditer(log))


def _cached(spec: OutOfTree, folder: Path, want: str, version: str | None,
            run: Runner) -> tuple[BuiltModule | None, str]:
    """The usable cached module, or None and why not."""
    module = folder / spec.module
    try:
        record = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError):
        return None, "not built yet"
    if not isinstance(record, dict) or not module.is_file():
        return None, "the cache holds no complete build"
    if version is not None and record.get("debian_version") != version:
        return None, f"built for Debian {record.get('debian_version')}, the lab kernel is {version}"
    have = vermagic(module, run)
    if have != want:
        return None, f"its vermagic {have!r} differs from the lab kernel's {want!r}"
    return BuiltModule(module, have, folder.parent.name if spec.key else folder.name, version), ""


def build_module(spec: OutOfTree, kernel: Kernel, cache: Path, progress: Callable[[str], None] = print,
                 run: Runner = _run, src_root: Path = SRC_ROOT) -> BuiltModule:
    """``spec``'s module for ``kernel``, from its cache folder or built there first.

    Used only if its vermagic equals rdma_rxe.ko's (the lab kernel's own module); a stale cache is built
    again, a fresh build that still differs is a LabError naming both. A failed build is a one-line LabError
    with the first error and where the whole log is.
    """
    want = vermagic(kernel.rxe_module, run)
    version = debian_version(kernel.vmlinuz)
    folder = spec.folder(cache, kernel.version)
    name = f"{spec.module} for {kernel.version}"
    module, why = _cached(spec, folder, want, version, run)
    if module is not None:
        progress(f"{name}: cached in {folder} (vermagic {want})")
        return module
    if kernel.suite is None:
        tree = host_tree(spec.module, kernel.version, version, spec.needs_source, src_root, run)
    else:
        tree = suite_tree(spec.module, kernel.version, version, kernel.suite, spec.needs_source, cache, progress, run)
    where = "" if tree.root == Path("/") else f" in the build root {tree.root}"
    progress(f"{name}: building ({why}) from {spec.origin} and {tree.headers.name}"
             f"{f' {version}' if version else ''}{where}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    failed_log = folder.with_name(f"{folder.name}.build-failed.log")
    staging = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
    try:
        built, found = _build(spec, tree, staging, failed_log, run)
        have = vermagic(built, run)
        if have != want:
            raise LabError(f"{spec.module} built from {tree.headers} has vermagic {have!r}, but the lab kernel's "
                           f"{kernel.rxe_module.name} has {want!r}: the headers do not match the kernel "
                           f"{kernel.vmlinuz}")
        record = {"release": kernel.version, "debian_version": version, "vermagic": have,
                  "built_from": [str(tree.headers), *([str(tree.tarball)] if tree.tarball else []), spec.origin],
                  "build_root": str(tree.root), **({"key": spec.key} if spec.key else {}),
                  "warnings": len(found)}
        (staging / COMPLETE).write_text(json.dumps(record, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp's 0700 would hide it from other users' labs
        if folder.exists():
            shutil.rmtree(folder)  # stale, or half made
        os.replace(staging, folder)
        failed_log.unlink(missing_ok=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if found:
        progress(f"{name}: {len(found)} warning{'s' if len(found) > 1 else ''} (not fatal), the first: {found[0]}; "
                 f"all in {folder / BUILD_LOG}")
    progress(f"{name}: built into {folder} (vermagic {want})")
    return BuiltModule(folder / spec.module, want, kernel.version, version, found)


def _build(spec: OutOfTree, tree: BuildTree, staging: Path, failed_log: Path,
           run: Runner) -> tuple[Path, tuple[str, ...]]:
    """Lay the sources out in a scratch folder (in the build root, if any), build there; the module, moved
    into ``staging``, and the build's warnings."""
    stem = spec.module.removesuffix(".ko")
    scratch = Path(tempfile.mkdtemp(prefix=f"{stem}-", dir=staging if tree.root == Path("/") else tree.root / "tmp"))
    try:
        source = spec.stage(tree, scratch, run)
        jobs = str(os.cpu_count() or 1)
        result = run(tree.command(["make", "-C", tree.inside(tree.headers), f"M={tree.inside(source)}",
                                   *spec.make_args, f"-j{jobs}", "modules"]), None)
        log = result.stdout + result.stderr
        (staging / BUILD_LOG).write_text(log)
        built = source / spec.module
        if result.returncode or not built.is_file():
            failed_log.write_text(log)
            raise LabError(f"building {spec.module} against {tree.headers} failed (exit {result.returncode}): "
                           f"{first_error(log, tree.inside(source))}; the full log: {failed_log}")
        module = staging / spec.module
        shutil.move(str(built), str(module))
        return module, warnings(log, tree.inside(source))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the sources and objects: only the module is kept
