"""siw.ko for the lab kernel: built once from the distribution's kernel source and headers, then cached.

Debian builds its kernels without Soft-iWARP (``# CONFIG_RDMA_SIW is not set``), but siw is in mainline
and builds out of tree in seconds (LAB.md): the siw folder of ``linux-source-<series>`` at the lab
kernel's exact Debian version, ``make M=... CONFIG_RDMA_SIW=m modules`` against the matching
``linux-headers-<release>``. How and where it is built and cached (``<kernel cache>/siw/<release>/``) is
:mod:`hil.lab.modules`'s, shared with san_proxy.ko.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hil.lab import LabError
from hil.lab.kernel import Kernel
from hil.lab.modules import (
    SRC_ROOT,
    BuildTree,
    BuiltModule,
    OutOfTree,
    Runner,
    _run,
    build_module,
    debian_version,
    host_tree,
    kernel_banner,
    suite_tree,
    vermagic,
)

__all__ = ["MODULE", "SRC_ROOT", "BuildTree", "SiwModule", "build_tree", "debian_version", "kernel_banner",
           "siw_module", "siw_suite_tree", "vermagic"]

SIW_DIR = "drivers/infiniband/sw/siw"
MODULE = "siw.ko"
SiwModule = BuiltModule


def _stage(tree: BuildTree, scratch: Path, run: Runner) -> Path:
    """The siw folder of the kernel's source tarball, unpacked into ``scratch``."""
    assert tree.tarball is not None
    top = tree.tarball.name.removesuffix(".tar.xz")  # the tarball's one top folder: linux-source-6.1
    result = run(["tar", "-xJf", str(tree.tarball), "-C", str(scratch), "--wildcards", f"{top}/{SIW_DIR}/*"], None)
    source = scratch / top / SIW_DIR
    if result.returncode or not (source / "Makefile").is_file():
        raise LabError(f"cannot unpack {SIW_DIR} from {tree.tarball}: {result.stderr.strip()[-600:]}")
    return source


def _spec(kernel: Kernel) -> OutOfTree:
    release = kernel.version
    return OutOfTree(MODULE, "siw", needs_source=True, stage=_stage, make_args=("CONFIG_RDMA_SIW=m",),
                     origin=f"linux-source-{'.'.join(release.split('.')[:2])}.tar.xz")


def build_tree(release: str, version: str | None, src_root: Path = SRC_ROOT, run: Runner = _run) -> BuildTree:
    """The host's headers and source for siw.ko of ``release`` (:func:`hil.lab.modules.host_tree`)."""
    return host_tree(MODULE, release, version, True, src_root, run)


def siw_suite_tree(release: str, version: str | None, suite: str, cache: Path, progress: Callable[[str], None],
                   run: Runner = _run) -> BuildTree:
    """The headers and source for siw.ko of ``release`` in Debian ``suite``'s build root."""
    return suite_tree(MODULE, release, version, suite, True, cache, progress, run)


def siw_module(kernel: Kernel, cache: Path, progress: Callable[[str], None] = print, run: Runner = _run,
               src_root: Path = SRC_ROOT) -> SiwModule:
    """siw.ko for ``kernel``, from ``<cache>/siw/<release>/`` or built there first."""
    return build_module(_spec(kernel), kernel, cache, progress, run, src_root)
