"""What a running lab consists of, on disk (``<state dir>/state.json``), and its processes.

``lab up`` saves the state after every process it starts, so that ``lab down`` from another process, or
after ``up`` was interrupted, finds everything. Every process of the lab leads its own session (vng and
the qemu it execs through a shell share it), so stopping a lab means signalling process groups.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hil.tools.lab import LabError

__all__ = [
    "DEFAULT_STATE_DIR",
    "STATE_FILE",
    "GuestState",
    "LabState",
    "group_members",
    "pid_alive",
    "stop_group",
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
    provider: str = "rxe"  # the RDMA provider of every guest (hil.tools.lab.provider)
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


# --- processes -------------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """Running (a zombie does not count: it has exited, only its parent has not looked yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _reap(pid: int) -> None:
    # When up and down run in one process (lab run, tests), the guests are our children: collect them.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every live process in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append((int(entry.name), comm))
    return sorted(members)


def stop_group(pgid: int, grace: float = 5.0) -> list[tuple[int, str]]:
    """SIGTERM the group, SIGKILL what is left after ``grace`` s; returns what survived both (nothing)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(pgid)
            if not group_members(pgid):
                break
            time.sleep(0.1)
    _reap(pgid)
    return group_members(pgid)
