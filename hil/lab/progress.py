"""What ``san-hil lab`` reports while it works: ``Progress``, one record per step on this module's logger.

The records go through :mod:`logging` (logger ``hil.lab.progress``), so pytest's ``log_cli`` and
``--log-file`` show a lab booted from a test; ``san-hil`` shows them on stderr with the seconds since it
started (its handler, :mod:`hil.cli.console`). Library code adds no handler of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TextIO

__all__ = ["Progress"]

log = logging.getLogger(__name__)


class Progress:
    """One record per step: ``lab1: ready marker (lab NIC enp0s3)``; safe from several threads.

    ``out``: also print each step there, as ``[  41.2s] lab1: ...`` (a caller that wants the lines itself).
    """

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, who: str, message: str) -> None:
        log.info("%s: %s", who, message)
        if self.out is not None:
            with self._lock:
                print(f"[{self.elapsed():6.1f}s] {who}: {message}", file=self.out, flush=True)
