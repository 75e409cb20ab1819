"""What a running lab consists of, on disk (``<state dir>/state.json``).

``lab up`` saves the state after every process it starts, so that ``lab down`` from another process, or
after ``up`` was interrupted, finds everything: the process groups it recorded (``hil.lab.procs``
judges and stops them) and the files it made.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hil.lab import LabError

__all__ = [
    "DEFAULT_STATE_DIR",
    "STATE_FILE",
    "GuestState",
    "LabState",
]

DEFAULT_STATE_DIR = Path("~/.cache/pytest-san/lab")
STATE_FILE = "state.json"
FORMAT = 1


@dataclass
class GuestState:
    name: str
    index: int
    ssh_port: int
    lab_mac: str
    mgmt_mac: str
    lab_address: str
    console_log: str
    pgid: int | None = None  # vng's pid = the guest's process group
    netdev: str | None = None  # the lab NIC's name inside the guest, once it said so
    attempts: int = 0
    accel: str = "tcg"


@dataclass
class LabState:
    state_dir: str
    hub_pgid: int | None = None
    hub_port: int | None = None
    guests: list[GuestState] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # everything up made outside its own bookkeeping
    inventory: str | None = None
    kernel: str | None = None  # the guests' vmlinuz
    kernel_release: str | None = None  # its release (uname -r in the guests): 6.12.117+deb13-amd64
    provider: str = "rxe"  # the RDMA provider of every guest (hil.lab.provider)
    proxy_module: bool | None = None  # san_proxy.ko loaded in every guest, or the stand-in; None: a lab before it
    low_memory: str | None = None  # RAM below 4 GiB ("256M", or "all": qemu's layout); None: a lab before it
    started: float = field(default_factory=time.time)
    ready: bool = False

    @property
    def path(self) -> Path:
        return Path(self.state_dir) / STATE_FILE

    def save(self) -> None:
        data = {"format": FORMAT, **asdict(self)}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)  # `lab down` from another process never reads half a file

    def add_file(self, path: Path | str) -> None:
        if str(path) not in self.files:
            self.files.append(str(path))

    @property
    def pgids(self) -> list[int]:
        groups = [g.pgid for g in self.guests if g.pgid is not None]
        return groups + ([self.hub_pgid] if self.hub_pgid is not None else [])

    @classmethod
    def load(cls, state_dir: Path) -> LabState | None:
        """The saved state, or None if there is none; LabError if the file is not ours."""
        path = state_dir / STATE_FILE
        try:
            raw: Any = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LabError(f"{path}: unreadable lab state ({exc}); remove it by hand") from None
        if not isinstance(raw, dict) or raw.pop("format", None) != FORMAT:
            raise LabError(f"{path}: not a lab state file of this version; remove it by hand")
        try:
            guests = [GuestState(**g) for g in raw.pop("guests", [])]
            return cls(guests=guests, **raw)
        except TypeError as exc:
            raise LabError(f"{path}: unexpected lab state ({exc}); remove it by hand") from None
