"""What ``san-hil lab`` prints while it works: ``Progress``, one timed line per step."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """One line per step: ``[  41.2s] lab1: ready marker (lab NIC enp0s3)``; safe from several threads."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, who: str, message: str) -> None:
        with self._lock:
            print(f"[{self.elapsed():6.1f}s] {who}: {message}", file=self.out or sys.stdout, flush=True)
