"""What ``san-hil`` writes to the terminal: streams that never fail on what they are given.

Under an ASCII locale (``LC_ALL=C PYTHONIOENCODING=ascii``) stdout refuses any other character, and a host
name, a path or a host's own message can carry one: printing it would crash the command after its work was
done. Only the command line's entry point changes the streams; library code never does.
"""

from __future__ import annotations

import io
import sys

__all__ = ["safe_streams"]


def safe_streams() -> None:
    """Write what the terminal's encoding cannot show as backslash escapes (``\\xe4``), not an exception."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")
