"""Finding the lab's tools: on PATH, else beside the running interpreter (a venv's bin), else in sbin.

``san-hil`` run by its full path from a venv (``.venv/bin/san-hil``, the venv not activated) must find what
that venv installed (virtme-ng's ``vng``) without ``PATH`` naming the venv; ``modinfo`` and friends live in
sbin, often not on a user's ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

SBIN = ("/usr/sbin", "/sbin")


def beside_interpreter() -> list[str]:
    """The running interpreter's scripts folders: its own (a venv's bin, unresolved) and its install's."""
    folders = [str(Path(sys.executable).parent), sysconfig.get_path("scripts")]
    return list(dict.fromkeys(f for f in folders if f))


def find_tool(name: str, path: str | None = None) -> str | None:
    """``name`` on ``path`` (default: PATH), else beside the running interpreter, else in sbin; None if nowhere."""
    found = shutil.which(name, path=path)
    if found is None:
        found = shutil.which(name, path=os.pathsep.join([*beside_interpreter(), *SBIN]))
    return found


def env_with(tool: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``tool``'s folder first on PATH, so that what it runs of its
    own installation (vng runs virtme's helpers) is found the same way."""
    out = dict(os.environ if env is None else env)
    folder = str(Path(tool).parent)
    parts = [p for p in out.get("PATH", "").split(os.pathsep) if p]
    if Path(tool).is_absolute() and folder not in parts:  # never "." on PATH
        out["PATH"] = os.pathsep.join([folder, *parts])
    return out
