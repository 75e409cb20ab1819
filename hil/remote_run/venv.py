"""The wheelhouse pushed to the run host and its venv made there (or reused), keyed by the wheelhouse's digest.

Both live in the directory the agent is pushed to (the transport's remote tmp, ``san_remote_tmp``, checked as for
the agent): the wheels as a verified, digest-checked push (``pytest-san-wheels-u<uid>-<digest>``), the venv beside
them (``pytest-san-venv-u<uid>-<digest>``), made by ``host/make_venv.py`` with the host's own python3.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from hil.remote_run.arguments import RunError
from hil.remote_run.wheelhouse import Wheelhouse
from hil.transport import Transport, content_digest

__all__ = ["HOST_SCRIPTS", "Venv", "ensure_venv"]

HOST_SCRIPTS = Path(__file__).resolve().parent / "host"
VENV_TIMEOUT = 900.0  # seconds to make a venv: installing ~15 wheels on a loaded TCG guest
_UID = re.compile(r"-u(\d+)-")


@dataclass(frozen=True)
class Venv:
    """A venv on the run host: its path and whether this run made it (else it was reused)."""

    path: str
    made: bool

    @property
    def python(self) -> str:
        return f"{self.path}/bin/python"


def ensure_venv(transport: Transport, python: list[str], wheelhouse: Wheelhouse) -> Venv:
    """Push ``wheelhouse`` (a no-op when the host has it) and make or reuse its venv."""
    files = {f"wheels/{name}": data for name, data in wheelhouse.wheels.items()}
    files["make_venv.py"] = (HOST_SCRIPTS / "make_venv.py").read_bytes()
    pushed = transport.push(files, name="pytest-san-wheels")
    digest = content_digest(files)
    uid = _UID.search(posixpath.basename(pushed))
    venv = posixpath.join(posixpath.dirname(pushed), f"pytest-san-venv-u{uid.group(1) if uid else 'x'}-{digest}")
    result = transport.run([*python, f"{pushed}/make_venv.py", f"{pushed}/wheels", venv, digest], VENV_TIMEOUT)
    words = result.stdout.split()
    if result.returncode != 0 or len(words) < 2 or words[-1] not in ("made", "reused"):
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {result.returncode}"
        raise RunError(f"{transport.label}: could not make the venv {venv}: {why}")
    return Venv(words[-2], made=words[-1] == "made")
