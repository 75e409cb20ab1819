"""The reports a remote run asked for, brought back from the host's tar of them to the paths the user gave."""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Sequence
from pathlib import Path

from hil.remote_run.arguments import Report, RunError

__all__ = ["bring_back"]


def bring_back(tar_bytes: bytes, reports: Sequence[Report]) -> list[Path]:
    """Write what the host packed for each report beside the report's local path (a pytest-html report's
    assets, a mutants --out directory whole); the report paths written. Only regular files and directories, only
    under a report's slot: nothing the host sends lands elsewhere."""
    slots = {report.slot: report for report in reports}
    written: list[Path] = []
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar.getmembers():
            name = posixpath.normpath(member.name)
            slot = next((s for s in slots if name == s or name.startswith(f"{s}/")), None)
            if slot is None or name.startswith(("/", "..")) or ".." in name.split("/"):
                raise RunError(f"the host's reports hold {member.name!r}, which no report asked for")
            inside = name[len(slot) + 1:]
            if not inside:
                continue
            target = slots[slot].local.parent / inside
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                source = tar.extractfile(member)
                if source is None:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read())
                if target == slots[slot].local:
                    written.append(target)
            else:
                raise RunError(f"the host's reports hold {member.name!r}, neither a file nor a directory")
    for report in reports:
        if report.local.is_dir() and report.local not in written:
            written.append(report.local)
    return written
