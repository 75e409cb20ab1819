"""The guest kernel: a Debian kernel package, fetched through apt and cached once.

This machine's own kernel has no RDMA; the distribution kernel carries ``rdma_rxe`` as a module. ``--kernel``
picks which (:data:`KERNELS`): Debian 12's 6.1 (the default), through the host's own apt sources, or Debian
13's 6.12, through a trixie source of the lab's own beside them (:mod:`hil.lab.apt`: the host's apt
state is not touched). The package is unpacked with ``dpkg-deb -x`` (nothing is installed on the host) and
``depmod`` is run on the unpacked tree once, so that guests booting in parallel never race to write
``modules.dep`` into it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hil.lab import LabError
from hil.lab.apt import HOST_APT, Apt

__all__ = ["DEFAULT_CACHE", "DEFAULT_KERNEL", "KERNELS", "META_PACKAGE", "Kernel", "KernelChoice", "fetch_kernel",
           "find_kernel", "image_package", "kernel_choice"]

DEFAULT_CACHE = Path("~/.cache/pytest-san/kernel")
META_PACKAGE = "linux-image-amd64"  # Debian's "current kernel" package; it depends on the versioned one
RXE_GLOB = "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*"
_COMPLETE = ".complete"  # written last: a cache folder without it is half-made and is made again

Runner = Callable[[Sequence[str], Path | None], subprocess.CompletedProcess[str]]


def _run(argv: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise LabError(
            f"{argv[0]} not found: the lab fetches its guest kernel from Debian packages "
            "(run on Debian/Ubuntu, or see hil/lab/install.sh)"
        )
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False, timeout=600)


@dataclass(frozen=True)
class KernelChoice:
    """What ``--kernel`` takes: a kernel series and the Debian release that ships it."""

    name: str  # 6.1, 6.12: the series the kernel's release must start with
    debian: str  # the release, for messages
    suite: str | None  # None: the host's own apt sources; else this Debian suite, read beside them


KERNELS: dict[str, KernelChoice] = {
    "6.1": KernelChoice("6.1", "Debian 12 (bookworm)", None),
    "6.12": KernelChoice("6.12", "Debian 13 (trixie)", "trixie"),
}
DEFAULT_KERNEL = "6.1"


def kernel_choice(name: str) -> KernelChoice:
    try:
        return KERNELS[name]
    except KeyError:
        raise LabError(f"unknown kernel {name!r}: the lab boots {' or '.join(KERNELS)}") from None


@dataclass(frozen=True)
class Kernel:
    """An unpacked kernel package: ``vmlinuz`` and the modules vng hands to the guest."""

    version: str  # the modules folder name (the kernel's release), e.g. 6.1.0-57-amd64, 6.12.117+deb13-amd64
    root: Path
    vmlinuz: Path
    modules: Path
    rxe_module: Path
    suite: str | None = None  # the Debian suite it came from, if not the host's own (siw.ko is built there)


def image_package(meta: str = META_PACKAGE, run: Runner = _run, apt: Apt = HOST_APT) -> str:
    """The versioned image package ``meta`` depends on (``linux-image-6.1.0-57-amd64``)."""
    result = run(apt.argv("apt-cache", "depends", meta), None)
    if result.returncode:
        update = "`apt-get update`" if apt.suite is None else f"`san-hil lab up` again ({apt.name}'s lists)"
        raise LabError(
            f"apt cannot find {meta} in {apt.name}: {result.stderr.strip() or result.stdout.strip()}; "
            f"run {update} (the lab needs Debian's kernel package for rdma_rxe)"
        )
    for line in result.stdout.splitlines():
        match = re.match(r"\s*\|?Depends:\s*(linux-image-\S+)", line)
        if match and match.group(1) != meta:
            return match.group(1)
    raise LabError(f"`apt-cache depends {meta}` names no versioned linux-image package:\n{result.stdout.strip()}")


def find_kernel(root: Path, suite: str | None = None) -> Kernel | None:
    """The kernel unpacked under ``root``, if it is complete and carries rdma_rxe."""
    for modules_base in (root / "lib/modules", root / "usr/lib/modules"):  # merged-/usr packages use the latter
        for modules in sorted(modules_base.glob("*")):
            rxe = sorted(modules.glob(RXE_GLOB))
            vmlinuz = next(iter(sorted((root / "boot").glob(f"vmlinuz-{modules.name}"))), None)
            if vmlinuz is None:
                vmlinuz = next(iter(sorted(modules.glob("vmlinuz"))), None)
            if rxe and vmlinuz is not None:
                return Kernel(modules.name, root, vmlinuz, modules, rxe[0], suite)
    return None


def fetch_kernel(
    cache: Path = DEFAULT_CACHE, progress: Callable[[str], None] = print, run: Runner = _run,
    choice: KernelChoice = KERNELS[DEFAULT_KERNEL],
) -> Kernel:
    """The cached guest kernel of ``choice``, downloaded and unpacked on first use."""
    cache = cache.expanduser()
    apt = HOST_APT if choice.suite is None else Apt.for_suite(choice.suite, cache)
    apt.prepare(run, progress, f"the {choice.name} lab kernel")
    package = image_package(run=run, apt=apt)
    version = package.removeprefix("linux-image-")
    if not version.startswith(f"{choice.name}.") and not version.startswith(f"{choice.name}-"):
        raise LabError(f"--kernel {choice.name}: {META_PACKAGE} in {apt.name} is {package}, not the {choice.name} "
                       f"kernel of {choice.debian}")
    folder = cache / version
    if (folder / _COMPLETE).is_file() and (kernel := find_kernel(folder, choice.suite)) is not None:
        progress(f"kernel {kernel.version}: cached in {folder}")
        return kernel
    progress(f"kernel {version}: downloading {package} from {apt.name} with apt-get")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{version}.partial-", dir=cache))
    try:
        result = run(apt.argv("apt-get", "download", package), staging)
        debs = sorted(staging.glob("*.deb"))
        if result.returncode or not debs:
            raise LabError(f"`apt-get download {package}` failed: {result.stderr.strip()[-800:]}")
        result = run(["dpkg-deb", "-x", str(debs[0]), str(staging)], None)
        if result.returncode:
            raise LabError(f"`dpkg-deb -x {debs[0].name}` failed: {result.stderr.strip()[-800:]}")
        for deb in debs:
            deb.unlink()  # 70 MB we never read again
        kernel = find_kernel(staging, choice.suite)
        if kernel is None:
            raise LabError(f"{package} has no vmlinuz with lib/modules/*/{RXE_GLOB}: this kernel lacks Soft-RoCE")
        if shutil.which("depmod"):
            run(["depmod", "-a", "-b", str(kernel.modules.parents[2]), kernel.version], None)
        (staging / _COMPLETE).write_text(package + "\n")
        if folder.exists():
            shutil.rmtree(folder)  # an incomplete earlier attempt
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    kernel = find_kernel(folder, choice.suite)
    if kernel is None:  # pragma: no cover - just verified in staging
        raise LabError(f"{folder}: kernel vanished after unpacking")
    progress(f"kernel {kernel.version}: unpacked into {folder}")
    return kernel
