"""san_proxy.ko for the lab kernel: the proxy driver's kernel module (hil/kmod), built once per kernel and source.

The sources ship in the ``hil.kmod`` package; they are copied into a scratch folder (never built in the
package, which may be read-only or shared) and built with ``W=1`` against the lab kernel's headers only, the
way :mod:`hil.lab.modules` builds every lab module. The cache is ``<kernel cache>/san_proxy/<release>/
<source digest>/``: an edited source is built again, and labs of an older source keep their own copy.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import hil.kmod
from hil.lab import LabError
from hil.lab.kernel import Kernel
from hil.lab.modules import SRC_ROOT, BuildTree, BuiltModule, OutOfTree, Runner, _run, build_module

__all__ = ["MODULE", "NO_PROXY_HINT", "san_proxy_module"]

MODULE = hil.kmod.MODULE  # san_proxy.ko
NO_PROXY_HINT = "or boot with --no-proxy-module (the agent's userspace stand-in)"


def _spec(source_dir: Path) -> OutOfTree:
    missing = [name for name in hil.kmod.SOURCES if not (source_dir / name).is_file()]
    if missing:
        raise LabError(f"san_proxy.ko's sources are incomplete: {', '.join(missing)} missing in {source_dir}; "
                       f"{NO_PROXY_HINT}")
    digest = hil.kmod.source_digest(source_dir)

    def stage(tree: BuildTree, scratch: Path, run: Runner) -> Path:
        folder = scratch / "san_proxy"
        folder.mkdir()
        for name in hil.kmod.SOURCES:
            shutil.copyfile(source_dir / name, folder / name)
        return folder

    return OutOfTree(MODULE, "san_proxy", needs_source=False, stage=stage, make_args=("W=1",), key=digest,
                     origin=f"{source_dir} (sources {digest})")


def san_proxy_module(kernel: Kernel, cache: Path, progress: Callable[[str], None] = print, run: Runner = _run,
                     src_root: Path = SRC_ROOT, source_dir: Path = hil.kmod.SOURCE_DIR) -> BuiltModule:
    """san_proxy.ko for ``kernel``, from ``<cache>/san_proxy/<release>/<digest>/`` or built there first."""
    return build_module(_spec(source_dir), kernel, cache, progress, run, src_root)
