"""Users of this machine whose login shell is not bash, for the transport tests over the test sshd.

sshd hands every command to the user's login shell, and ``useradd`` gives new users ``/bin/sh``: dash on
Debian, whose ``kill`` takes other options than bash's. As root, the users are made once per machine and
kept, like those of ``tests/support/users.py``: ``san-test-dash`` (dash) and ``san-test-busybox`` (busybox
sh, through a link named ``sh``: busybox runs the applet its name says), no password (``*``: not locked, so
sshd without PAM takes a key) and / for a home (sshd writes that it cannot chdir to a missing one into every
command's stderr). Without root, or without the shell, the test is skipped saying why.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

SHELLS = ("dash", "busybox")
BUSYBOX_SH = Path("/usr/local/lib/pytest-san-busybox/sh")
_LOCK = Path("/etc/passwd")  # flocked, as tests/support/users.py does: parallel sessions make them in turn


def _shell(kind: str) -> str:
    if kind == "dash":
        if Path("/bin/sh").resolve().name == "dash":
            return "/bin/sh"  # what useradd gives a new user on Debian
        found = shutil.which("dash")
        if found is None:
            pytest.skip("dash is not installed: apt-get install dash to test a dash login shell")
        return found
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed: apt-get install busybox to test a busybox login shell")
    if not BUSYBOX_SH.is_symlink():
        BUSYBOX_SH.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        BUSYBOX_SH.symlink_to(busybox)
    return str(BUSYBOX_SH)


def shell_user(kind: str) -> pwd.struct_passwd:
    """The user whose login shell is ``kind`` (one of SHELLS), made if missing; skipped without root."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to make a user whose login shell is {kind} (useradd)")
    name = f"san-test-{kind}"
    with _LOCK.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shell = _shell(kind)
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/",
                            "--shell", shell, "--password", "*", name], check=True, capture_output=True)
            user = pwd.getpwnam(name)
        if (user.pw_shell, user.pw_dir) != (shell, "/"):
            subprocess.run(["usermod", "--shell", shell, "--home", "/", name], check=True, capture_output=True)
            user = pwd.getpwnam(name)
    return user
