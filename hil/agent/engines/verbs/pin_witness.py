"""The kernel's books of pinned pages, as a witness of R12 on every lab.

Every MR pins the pages it covers (``ib_umem_get``, and siw's own umem) and counts them in its process's
``mm->pinned_vm``, which /proc/PID/status shows as ``VmPin``; so does every pin of the proxy's kernel module. The
machine as a whole counts every long-term pin in /proc/vmstat (``nr_foll_pin_acquired`` less
``nr_foll_pin_released``). A reading compares both with what the agent's processes declare: each process's VmPin
must be its own at start plus the pages of the MRs it declares (its registrations and the engine's own) and of
its proxy pins, and the pins the machine holds beyond what it held when the agent started must be those of the
agent's processes. A page pinned that nothing declares is a pin outliving the registration that needed it; one
missing is a registration that pins nothing: both break R12.

A pin can lag its release by a moment (a device finishing with an MR), so a reading that finds a difference looks
again, briefly, before it says so. Standard library only, Python 3.9+.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_san.spi.contract import PAGE_SIZE

__all__ = ["PinWitness", "foll_pins", "pages_spanned", "vm_pin_pages"]

SETTLE = (0.05, 0.2, 0.5)  # seconds between the looks of a reading that found a difference


def vm_pin_pages(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The pages ``pid`` has pinned (VmPin), or None when it is gone or the kernel does not say."""
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmPin:"):
            return int(line.split()[1]) * 1024 // PAGE_SIZE
    return None


def foll_pins(vmstat: Path = Path("/proc/vmstat"), refresh: Path = Path("/proc/sys/vm/stat_refresh")) -> int | None:
    """Pages pinned on the whole machine now (nr_foll_pin_acquired - nr_foll_pin_released), or None. The counters
    are gathered from each CPU now and then: writing vm.stat_refresh (root) folds them in first."""
    with contextlib.suppress(OSError):
        refresh.write_text("1\n")
    try:
        fields = dict(line.split() for line in vmstat.read_text().splitlines() if line.count(" ") == 1)
        return int(fields["nr_foll_pin_acquired"]) - int(fields["nr_foll_pin_released"])
    except (OSError, KeyError, ValueError):
        return None


def pages_spanned(address: int, length: int) -> int:
    return 0 if length <= 0 else (address + length - 1) // PAGE_SIZE - address // PAGE_SIZE + 1


class PinWitness:
    """Judges the pinned pages of the agent's processes against what they declare."""

    def __init__(self, vm_pin: Callable[[int], int | None] = vm_pin_pages,
                 machine: Callable[[], int | None] = foll_pins) -> None:
        self._vm_pin = vm_pin
        self._machine = machine
        self.machine_base = machine()

    def _look(self, processes: Sequence[dict[str, Any]],
              others: Sequence[int]) -> tuple[dict[str, int], list[str]]:
        pinned: dict[str, int] = {}
        findings: list[str] = []
        ours = 0
        for process in processes:
            expected = process.get("vm_pin_pages")
            pid = process["pid"]
            have = self._vm_pin(pid)
            if expected is None or have is None:
                continue
            pinned[str(pid)] = have
            base = int(process.get("vm_pin_base", 0))
            ours += have - base
            who = f"pid {pid} ({process.get('role', 'process')})"
            if have > base + expected:
                findings.append(f"{who} has {have - base - expected} page(s) pinned (VmPin {have * PAGE_SIZE >> 10} "
                                f"kB) that none of its registrations or proxy pins explains: a pin outlived what "
                                f"needed it")
            elif have < base + expected:
                findings.append(f"{who} has {base + expected - have} page(s) fewer pinned than its registrations "
                                f"and proxy pins cover (VmPin {have * PAGE_SIZE >> 10} kB)")
        ours += sum(max(0, self._vm_pin(pid) or 0) for pid in others)
        now = self._machine()
        if now is not None and self.machine_base is not None and now - self.machine_base != ours:
            findings.append(f"the machine holds {now - self.machine_base} long-term pinned page(s) more than when "
                            f"the agent started (nr_foll_pin_acquired - nr_foll_pin_released), where the agent's "
                            f"processes account for {ours}")
        return pinned, findings

    def read(self, processes: Sequence[dict[str, Any]], others: Sequence[int] = ()) -> tuple[dict[str, int],
                                                                                              list[str]]:
        """({pid: VmPin pages}, findings) for ``processes`` (each with ``pid`` and, where it declares them,
        ``vm_pin_pages`` and ``vm_pin_base``); ``others``: pids of the agent's processes that declare nothing
        (observed programs), counted in the machine's total only."""
        pinned, findings = self._look(processes, others)
        for pause in SETTLE:
            if not findings:
                break
            time.sleep(pause)
            pinned, findings = self._look(processes, others)
        return pinned, findings
