"""``san-hil matrix DIR``: the kernel x provider table of a night's labs (:mod:`hil.nightly.kernel_matrix`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hil.nightly.kernel_matrix import render, write_matrix

__all__ = ["add_matrix_command"]


def add_matrix_command(commands: Any) -> None:
    p = commands.add_parser("matrix", allow_abbrev=False,
                            help="the kernel x provider table of a night's labs (DIR/<provider>-<kernel>/report.json "
                                 "of san-hil nightly): DIR/matrix.md and matrix.json")
    p.add_argument("directory", type=Path, help="the folder .ci/nightly writes (SAN_NIGHTLY_OUT)")
    p.set_defaults(run=_run)


def _run(args: Any) -> int:
    directory: Path = args.directory
    if not directory.is_dir():
        why = "is not a directory" if directory.exists() else "no such directory"
        print(f"san-hil matrix: {directory}: {why} (the folder san-hil nightly's labs wrote)", file=sys.stderr)
        return 2
    rows = write_matrix(directory)
    if not rows:
        print(f"san-hil matrix: no <provider>-<kernel>/report.json in {args.directory}", file=sys.stderr)
        return 2
    print(render(rows), end="")
    return 0
