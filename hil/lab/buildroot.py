"""A build root of another Debian release, for the lab's modules (siw.ko, san_proxy.ko) of a kernel that is not
the host's own.

Debian 13's kernel headers come with kbuild tools linked against trixie's glibc, and a Makefile that calls
gcc-14: they do not run on a Debian 12 host. So modules for the 6.12 kernel are built in a trixie root, made
once with ``mmdebstrap`` (the essential packages, the compiler, make and what kbuild links against) and
cached in ``<kernel cache>/buildroot/<suite>/``. Each kernel's headers (and source) are unpacked into it from
their packages with ``dpkg-deb -x`` (downloaded through the suite's own apt source, :mod:`hil.lab.apt`):
apt would not install them there, as ``linux-headers-*`` depends on the kernel image itself. ``make`` runs
in it through ``chroot``, which needs root; the module is cached afterwards, so that is once per kernel
(and per source, for san_proxy.ko).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from hil.lab import LabError
from hil.lab.apt import MIRROR, Apt

__all__ = ["ROOT_PACKAGES", "build_root", "dependencies", "in_root", "need_root", "unpack_packages"]

# What kbuild needs in each suite's root: its compiler (the headers' .kernelvariables name it), make, what
# linux-kbuild-* depends on (pahole for the modules' BTF), and perl: W=1 (san_proxy.ko) runs scripts/kernel-doc,
# which needs Pod::Usage (perl-modules), not in the essential perl-base. A root made with another list is
# made again.
ROOT_PACKAGES: dict[str, tuple[str, ...]] = {
    "trixie": ("gcc-14", "make", "pahole", "libelf1t64", "libssl3t64", "zlib1g", "perl"),
}
_COMPLETE = ".pytest-san-complete"  # in the root, written last
_UNPACKED = "var/lib/pytest-san"  # in the root: one file per package unpacked into it, holding its version
_ENV = ("/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "HOME=/", "LC_ALL=C.UTF-8")

Runner = Callable[[Sequence[str], Path | None], subprocess.CompletedProcess[str]]


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise LabError(f"{what} needs root (mmdebstrap and chroot); run this `san-hil lab up` once as root: the "
                       "module it builds is cached, and later labs of any user use it")


def build_root(suite: str, cache: Path, progress: Callable[[str], None], run: Runner, purpose: str = "siw.ko") -> Path:
    """``<cache>/buildroot/<suite>/``, made with mmdebstrap on first use (and again when its packages change)."""
    root = cache.expanduser() / "buildroot" / suite
    packages = ROOT_PACKAGES.get(suite)
    if packages is None:
        raise LabError(f"no build root is known for Debian {suite} (known: {', '.join(ROOT_PACKAGES)})")
    recipe = f"mmdebstrap --variant=essential {suite}: {' '.join(packages)}"
    made = _record(root / _COMPLETE)
    if made == recipe:
        return root
    if made is not None:
        progress(f"Debian {suite} build root {root} was made with {made.partition(': ')[2]}; making it again with "
                 f"{' '.join(packages)}")
    need_root(f"making a Debian {suite} build root for {purpose}")
    if shutil.which("mmdebstrap") is None:
        raise LabError(f"mmdebstrap not found: {purpose} for a Debian {suite} kernel is built in a {suite} root it "
                       "makes (as root: apt-get install mmdebstrap, or sh hil/lab/install.sh)")
    progress(f"Debian {suite} build root for {purpose}: making it with mmdebstrap in {root} ({', '.join(packages)})")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{suite}.partial-", dir=root.parent))
    try:
        result = run(["mmdebstrap", "--variant=essential", f"--include={','.join(packages)}", suite, str(staging),
                      MIRROR], None)
        if result.returncode:
            raise LabError(f"mmdebstrap of Debian {suite} into {staging} failed (exit {result.returncode}):\n"
                           f"{(result.stderr or result.stdout).strip()[-1200:]}")
        staging.chmod(0o755)
        (staging / _COMPLETE).write_text(recipe + "\n")
        if root.exists():
            shutil.rmtree(root)  # half made, or of another recipe
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"Debian {suite} build root for {purpose}: made in {root}")
    return root


def unpack_packages(root: Path, apt: Apt, packages: Sequence[str], version: str,
                    progress: Callable[[str], None], run: Runner, purpose: str = "siw.ko") -> None:
    """Each of ``packages`` at ``version`` unpacked into ``root`` (downloaded once: a record in the root
    says which version of each it holds)."""
    records = root / _UNPACKED
    wanted = [p for p in packages if _record(records / p) != version]
    if not wanted:
        return
    need_root(f"unpacking {', '.join(wanted)} into {root} for {purpose}")
    progress(f"downloading {', '.join(wanted)} {version} from {apt.name} into the build root {root}")
    records.mkdir(parents=True, exist_ok=True)
    downloads = Path(tempfile.mkdtemp(prefix="debs-", dir=root / "tmp"))
    try:
        result = run(apt.argv("apt-get", "download", *(f"{p}={version}" for p in wanted)), downloads)
        debs = sorted(downloads.glob("*.deb"))
        if result.returncode or len(debs) != len(wanted):
            raise LabError(f"`apt-get download` of {', '.join(wanted)} {version} from {apt.name} failed: "
                           f"{(result.stderr or result.stdout).strip()[-800:]}")
        for deb in debs:
            result = run(["dpkg-deb", "-x", str(deb), str(root)], None)
            if result.returncode:
                raise LabError(f"`dpkg-deb -x {deb.name} {root}` failed: {result.stderr.strip()[-800:]}")
        for package in wanted:
            (records / package).write_text(version + "\n")
    finally:
        shutil.rmtree(downloads, ignore_errors=True)


def _record(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def dependencies(apt: Apt, package: str, version: str, pattern: str, run: Runner) -> list[str]:
    """The packages ``package`` (at ``version``) depends on whose names match ``pattern``."""
    result = run(apt.argv("apt-cache", "show", f"{package}={version}"), None)
    if result.returncode:
        raise LabError(f"{apt.name} has no {package} {version}: {(result.stderr or result.stdout).strip()[-400:]}")
    depends = next((line for line in result.stdout.splitlines() if line.startswith("Depends:")), "")
    return sorted({m.group(1) for m in re.finditer(r"(?:^|[ ,|])(" + pattern + r")(?=[ ,(]|$)",
                                                        depends.removeprefix("Depends:"))})


def in_root(root: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run in ``root`` through chroot with a clean environment; its paths must be the root's own."""
    return ["chroot", str(root), *_ENV, *argv]
