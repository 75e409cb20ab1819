"""Whether this host can run the kernel's NVMe over Fabrics on RDMA (the capability ``nvme_rdma``), and the child
that drives it. Standard library only, Python 3.9+."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from hil.agent.observe.driver import PROGRAMS, ObservedChild

MODULES = ("nvme-rdma", "nvmet-rdma", "null_blk", "nvme-fabrics", "nvmet")
OWNERS = ("nvme_rdma", "nvmet_rdma", "rdma_cm")
"""The modules whose objects an NVMe-oF child is judged by: the host's and the target's, and the connection
manager's (which the kernel names as the owner of both ends' queue pairs)."""


def nvme_rdma_available(release: str | None = None, modules_root: Path = Path("/lib/modules")) -> str | None:
    """None when the kernel ships the host, target and backing modules and nvme-cli is installed (and the agent
    runs as root); else why not, in a few words."""
    if os.geteuid() != 0:
        return "the agent does not run as root (modprobe, configfs)"
    if shutil.which("nvme") is None:
        return "no nvme-cli (nvme) on the PATH"
    release = release or os.uname().release
    shipped: set[str] = set()
    for index in ("modules.dep", "modules.builtin"):
        try:
            with open(modules_root / release / index) as f:
                for line in f:
                    name = line.split(":", 1)[0].rsplit("/", 1)[-1].split(".ko", 1)[0]
                    shipped.add(name.replace("_", "-"))
        except OSError:
            continue
    missing = [m for m in MODULES if m.replace("_", "-") not in shipped]
    if missing:
        return f"kernel {release} ships no {', '.join(missing)}"
    return None


def nvme_fabric_child(device: str | None, address: str | None) -> ObservedChild:
    """An NVMe-oF driver child (``fabric.py``), read by module, with its state file and the cleanup that undoes
    whatever it made once it ends."""
    fd, state = tempfile.mkstemp(prefix="pytest-san-nvme-", suffix=".json")
    os.close(fd)
    return ObservedChild(device, address, program="nvme", modules=OWNERS, extra=["--state", state],
                         cleanup=[sys.executable, PROGRAMS["nvme"], "--cleanup", "--state", state])
