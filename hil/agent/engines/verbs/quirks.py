"""Kernel bugs of the soft RDMA drivers that the verbs engine works around, and on which kernels it must.

A workaround is applied by driver and kernel, never by guess: each one names the driver (as the device says
it in sysfs ``node_desc``), the kernel series that need it (from ``broken_from``, the first found broken, None:
every one before ``fixed_in``; up to ``fixed_in``, the first found fixed, None: every one since) and what goes
wrong without it. ``retested`` is what its reproducer (``san-hil lab reproduce NAME``, run with the workaround
off) found on each kernel series the lab boots, the table in docs/lab.md; a kernel older than ``fixed_in`` gets
the workaround, a newer one does not, unless ``kept`` says why the engine applies it where the bug is gone. The
agent's hello lists what it applies so the report says so.

``SAN_VERBS_WORKAROUNDS`` overrides it for a reproducer: ``none`` applies none, ``all`` every one, or a
comma-separated list of names; anything else (unset, ``auto``) decides by kernel.

Standard library only, Python 3.9+.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["GONE", "KERNELS", "THERE", "WORKAROUNDS", "Workaround", "applied", "driver_of", "kernel_series"]

SYSFS = "/sys/class/infiniband"
ENV = "SAN_VERBS_WORKAROUNDS"
_DRIVERS = {"rxe": "rxe", "Software iWARP stack": "siw"}  # node_desc as each driver sets it
KERNELS = ((6, 1), (6, 12))  # the series the lab boots (san-hil lab up --kernel): each workaround is retested on each
THERE, GONE = "there", "gone"  # a reproducer's verdicts (exit 1, 0)


@dataclass(frozen=True)
class Workaround:
    name: str
    driver: str  # rxe, siw
    bug: str  # what the kernel does without the workaround (where, in its source)
    does: str  # what the engine does instead
    rule: str  # the rule it keeps: the one the kernel's bug would break without it
    fixed_in: tuple[int, int] | None = None  # first kernel series found not to need it; None: every one tested
    broken_from: tuple[int, int] | None = None  # first kernel series found to need it; None: every older one too
    retested: tuple[tuple[tuple[int, int], str], ...] = ()  # (series, THERE or GONE), as its reproducer found
    kept: str = ""  # why the engine applies it where the bug is gone ("": only where the bug is)

    @property
    def why(self) -> Literal["kernel-bug"]:
        """Its kind of reason in the table of known differences: each one here works around a kernel's bug."""
        return "kernel-bug"

    @property
    def reproducer(self) -> str:
        """The lab command that shows the bug (hil/lab/reproduce.py holds one for each name)."""
        return f"san-hil lab reproduce {self.name}"

    def broken(self, series: tuple[int, int] | None) -> bool:
        """Whether the kernel has the bug, as ``broken_from`` and ``fixed_in`` say (an unknown kernel: yes)."""
        if series is None:
            return True
        return (self.broken_from is None or series >= self.broken_from) and (
            self.fixed_in is None or series < self.fixed_in)

    def needed(self, series: tuple[int, int] | None) -> bool:
        return bool(self.kept) or self.broken(series)


_BOTH_THERE = (((6, 1), THERE), ((6, 12), THERE))

WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround("siw-zero-length-sge", "siw",
               "siw_tx_hdt dereferences the NULL memory object of a zero-length SGE in a send or RDMA write: an "
               "oops, and the device hangs",
               "a zero-length scatter entry is not posted (a send left with none goes with no SGE)",
               rule="R14",  # a zero-length entry is legal (CONTRACT.md section 4): it must complete
               retested=_BOTH_THERE),
    Workaround("siw-unchecked-remote-access", "siw",
               "the responder serves an RDMA read of an MR registered without REMOTE_READ (siw_qp_sq_proc checks "
               "a read response's memory with no access asked), and checks a tagged write's bounds segment by "
               "segment (siw_proc_write), placing the first segments of an over-long one",
               "an iWARP descriptor states the access it grants; the initiator checks that and the range first",
               rule="R7",  # a read served from memory registered without remote read (and R8)
               retested=_BOTH_THERE),
    Workaround("rxe-zero-length-read", "rxe",
               "an RDMA read of zero bytes never completes (as the lab fuzz once saw it; retested, it completes "
               "SUCCESS on 6.1 and 6.12)",
               "an RDMA transfer of zero bytes is completed by the engine, checked against the descriptor's range",
               rule="R14",  # every operation completes with a status
               retested=(((6, 1), GONE), ((6, 12), GONE)),
               kept="rxe checks no rkey, range or access of a zero-byte transfer (the IB spec lets a NIC skip "
                    "them): one at offset 8192 of a 4096-byte window completes SUCCESS; the engine completes it "
                    "itself, checked against the range its descriptor states, as on every other device"),
    Workaround("rxe-flushed-local-error", "rxe",
               "a send or RDMA write whose scatter list names an lkey nobody holds completes WR_FLUSH_ERR: the QP "
               "goes to error and the failing request is flushed as if something else had failed (6.1 reports "
               "LOC_QP_OP_ERR)",
               "a source entry whose handle the socket does not know is refused before posting: LOCAL_PROTECTION, "
               "0 bytes, the connection's local end in error",
               rule="R14",  # LOCAL_PROTECTION, not a flush as if something else had failed
               broken_from=(6, 12), retested=(((6, 1), GONE), ((6, 12), THERE))),
    Workaround("rxe-local-op-replayed", "rxe",
               "a memory-window bind or a local invalidate posted behind a request still waiting on the peer "
               "(RNR NAK retries) breaks that request: 6.12 replays it with the retry, the second one fails, "
               "the QP goes to error and every request is flushed; on 6.1 the waiting request never "
               "completes, neither when its retries run out nor once the peer's receive comes",
               "while a send, RDMA write or read is outstanding on the socket, a window is an MR with the "
               "remote rights and its release is the dealloc alone (no bind or invalidate is posted)",
               rule="R14",  # the waiting request completes with its own status
               retested=_BOTH_THERE),
)


def kernel_series(release: str) -> tuple[int, int] | None:
    """(6, 12) of ``6.12.117+deb13-amd64``."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else None


def driver_of(device: str) -> str | None:
    """The soft driver behind ``device`` (rxe, siw), as its node description says, or None."""
    try:
        with open(os.path.join(SYSFS, device, "node_desc")) as f:
            desc = f.read().strip()
    except OSError:
        return None
    return _DRIVERS.get(desc)


def applied(driver: str | None, release: str | None = None, override: str | None = None) -> list[Workaround]:
    """The workarounds this driver on this kernel (``uname -r``) needs, or what ``SAN_VERBS_WORKAROUNDS`` says."""
    release = os.uname().release if release is None else release
    choice = (os.environ.get(ENV, "") if override is None else override).strip()
    mine = [w for w in WORKAROUNDS if w.driver == driver]
    if choice == "none":
        return []
    if choice == "all":
        return mine
    if choice and choice != "auto":
        names = {name.strip() for name in choice.split(",")}
        return [w for w in mine if w.name in names]
    series = kernel_series(release)
    return [w for w in mine if w.needed(series)]
