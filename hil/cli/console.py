"""What ``san-hil`` writes to the terminal: streams that never fail on what they are given, and hil's log
records (the lab's progress, warnings) on stderr.

Under an ASCII locale (``LC_ALL=C PYTHONIOENCODING=ascii``) stdout refuses any other character, and a host
name, a path or a host's own message can carry one: printing it would crash the command after its work was
done. Only the command line's entry point changes the streams and adds a log handler; library code logs to
its module's logger and never does either.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["log_to_stderr", "print_safely", "safe_streams"]


def safe_streams() -> None:
    """Write what the terminal's encoding cannot show as backslash escapes (``\\xe4``), not an exception."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def print_safely(line: str, stream: TextIO | None = None) -> None:
    """Print ``line`` whatever the stream's encoding (LC_ALL=C, PYTHONIOENCODING=ascii): what it cannot
    show is escaped. A progress line never stops a run that has results to write (issue 12)."""
    stream = stream if stream is not None else sys.stdout
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        stream.write(line.encode(encoding, "backslashreplace").decode(encoding) + "\n")
        stream.flush()
    except (LookupError, OSError, ValueError):  # an unknown codec, a closed pipe or file
        pass


class _Elapsed(logging.Formatter):
    """``[  41.2s] lab1: ready marker``: seconds since the command started; the level only above INFO."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.time()

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        return f"[{record.created - self.t0:6.1f}s] {level}{super().format(record)}"


PROGRESS = ("hil.cli.", "hil.lab.", "hil.nightly.", "hil.measure.")
"""The loggers of the command line and what its commands run (the lab's boot, nightly's runs): their progress
shows without --verbose."""


def _progress_or_worse(record: logging.LogRecord) -> bool:
    """Without --verbose: the commands' own progress, and everyone's warnings."""
    return record.name.startswith(PROGRESS) or record.levelno >= logging.WARNING


@contextmanager
def log_to_stderr(verbose: bool = False) -> Iterator[logging.Handler]:
    """hil's records on stderr while the command runs: the commands' progress and warnings, or, ``verbose``,
    everything down to DEBUG (agents starting and stopping, SSH connections, leases)."""
    logger = logging.getLogger("hil")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Elapsed())
    if not verbose:
        handler.addFilter(_progress_or_worse)
    previous = logger.level
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
