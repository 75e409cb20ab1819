"""On the lab host: make, or reuse, the venv of a pushed wheelhouse. Python 3.9+, standard library only.

    python3 make_venv.py WHEELHOUSE VENV DIGEST

VENV (``<remote tmp>/pytest-san-venv-u<uid>-<digest>``) is reused only if it is a directory of ours, writable by
no one else, whose ``.complete`` holds DIGEST. Otherwise it is built under ``VENV.partial-<pid>`` (``python3 -m
venv --without-pip``, then the wheelhouse's own pip installs every wheel, no index), ``.complete`` written last,
and renamed into place: no half-written venv is ever used. A build that is stopped (TERM, HUP, INT) removes its
partial directory; one that was killed outright is removed by the next build (its pid is gone). Prints the
venv's path, then ``made`` or ``reused``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import stat
import subprocess
import sys

MARKER = ".complete"


def good(venv: str, digest: str) -> bool:
    try:
        found = os.lstat(venv)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
            return False
        with open(os.path.join(venv, MARKER)) as marker:
            return marker.read() == f"{digest}\n"
    except OSError:
        return False


def _stopped(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _clean_stale(venv: str) -> None:
    """Remove partial builds of this venv whose process is gone (killed outright: no chance to clean up)."""
    parent, base = os.path.split(venv)
    for name in os.listdir(parent):
        pid = name[len(base) + len(".partial-"):]
        if name.startswith(f"{base}.partial-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def build(wheelhouse: str, venv: str, digest: str) -> None:
    staging = f"{venv}.partial-{os.getpid()}"
    try:
        os.mkdir(staging, 0o700)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", staging], check=True,
                       stdin=subprocess.DEVNULL, stdout=sys.stderr)
        wheels = sorted(glob.glob(os.path.join(wheelhouse, "*.whl")))
        pips = [w for w in wheels if os.path.basename(w).startswith("pip-")]
        if not pips:
            raise SystemExit(f"{wheelhouse}: no pip wheel in the wheelhouse")
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.pop("PYTHONPATH", None)
        subprocess.run([os.path.join(staging, "bin", "python"), os.path.join(pips[0], "pip"), "install", "--quiet",
                        "--no-index", "--no-deps", "--no-warn-script-location", *wheels],
                       check=True, stdin=subprocess.DEVNULL, stdout=sys.stderr, env=env)
        with open(os.path.join(staging, MARKER), "w") as marker:
            marker.write(f"{digest}\n")
        try:
            os.rename(staging, venv)
        except OSError:
            if not good(venv, digest):  # not a racing build's good copy
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str]) -> int:
    wheelhouse, venv, digest = argv[1:4]
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _stopped)
    if good(venv, digest):
        print(venv)
        print("reused")
        return 0
    _clean_stale(venv)
    if os.path.lexists(venv):  # ours but unusable (a lost marker), or not ours: never used, moved aside if ours
        if os.lstat(venv).st_uid != os.getuid():
            print(f"{venv} belongs to another user: set san_remote_tmp to a directory of your own", file=sys.stderr)
            return 3
        aside = f"{venv}.stale-{os.getpid()}"
        os.rename(venv, aside)
        shutil.rmtree(aside, ignore_errors=True)
    build(wheelhouse, venv, digest)
    print(venv)
    print("made")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
