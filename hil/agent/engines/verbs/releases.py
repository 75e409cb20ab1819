"""Verbs objects the device would not release yet: kept, retried, and reported as leaks until it does.

An MR still covered by a bound window, or a PD whose QP the kernel still holds, refuses ``close()``
for a moment. Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

import time
from typing import Any


class Releases:
    """Owns the verbs objects (MR, MW, QP, PD) whose release the device refused so far."""

    def __init__(self) -> None:
        self.held: list[Any] = []

    def close(self, obj: Any) -> None:
        """Close an MR or MW, retrying for half a second; one the device still holds is kept for later."""
        for _ in range(50):
            try:
                obj.close()
                return
            except Exception:
                time.sleep(0.01)
        self.held.append(obj)

    def close_once(self, obj: Any) -> None:
        """Close a QP or PD; one the device refuses is kept for later."""
        try:
            obj.close()
        except Exception:
            self.held.append(obj)

    def retry(self) -> None:
        keep = []
        for obj in self.held:
            try:
                obj.close()
            except Exception:
                keep.append(obj)
        self.held = keep

    def leaks(self, pid: int) -> list[str]:
        self.retry()
        return [f"pid {pid}: unreleased {type(obj).__name__}" for obj in self.held]
