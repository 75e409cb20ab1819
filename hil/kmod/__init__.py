"""The ``san_proxy`` kernel module's sources, shipped in the wheel so that a lab or a host can build them.

``san-hil lab up`` builds the module out of tree for its guest kernel (:mod:`hil.lab.proxy`) from a
copy of :data:`SOURCES` and caches it by kernel release and :func:`source_digest`: an edited source is built
again. On a real host: ``make -C <this folder> && insmod <this folder>/san_proxy.ko``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

__all__ = ["MODULE", "SOURCES", "SOURCE_DIR", "header_abi", "source_digest"]

SOURCE_DIR = Path(__file__).parent
SOURCES = ("san_proxy.c", "san_proxy.h", "Kbuild")  # what kbuild reads with M=; the Makefile is for `make -C`
MODULE = "san_proxy.ko"


def source_digest(folder: Path = SOURCE_DIR) -> str:
    """sha256 over each source's name and bytes, hex, 16 digits: the module's cache key beside the kernel's."""
    digest = hashlib.sha256()
    for name in SOURCES:
        data = (folder / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def header_abi(folder: Path = SOURCE_DIR) -> int | None:
    """``SAN_PROXY_ABI`` of the uapi header: what a module built from these sources reports."""
    try:
        match = re.search(r"^#define\s+SAN_PROXY_ABI\s+(\d+)", (folder / "san_proxy.h").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None
