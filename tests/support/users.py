"""Two real users of this machine besides root, for the tests of lab hosts that several users share.

``SAN_TEST_USERS=alice,bob`` names existing users to use (each with a login shell). Otherwise, as root,
two system accounts are made once per machine and kept, like the packages ``hil/lab/install.sh``
installs: ``san-test-a`` and ``san-test-b``, with no password (``*``: not locked, so sshd without PAM takes a
key), no home and ``/bin/sh``. Without root and without that variable the tests that need them are skipped.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import subprocess
from pathlib import Path

import pytest

USERS = ("san-test-a", "san-test-b")
USERS_ENV = "SAN_TEST_USERS"
_LOCK = Path("/etc/passwd")  # flocked: parallel sessions (tox envs) make them one at a time, leaving no file


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def other_users() -> list[pwd.struct_passwd]:
    """Two users other than the one running the tests; the test is skipped, saying why, without them."""
    named = [n.strip() for n in os.environ.get(USERS_ENV, "").split(",") if n.strip()]
    if named:
        found = [_user(n) for n in named[:2]]
        missing = [n for n, u in zip(named[:2], found, strict=True) if u is None]
        if len(named) < 2 or missing:
            pytest.fail(f"{USERS_ENV}={os.environ[USERS_ENV]}: need two existing users (missing: {missing})")
        return [u for u in found if u is not None]
    if os.geteuid() != 0:
        pytest.skip(f"needs two more users: run as root (they are made once) or set {USERS_ENV}=user1,user2")
    with _LOCK.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in USERS:
            if _user(name) is None:
                subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                                "--shell", "/bin/sh", "--password", "*", name], check=True, capture_output=True)
    return [u for u in map(_user, USERS) if u is not None]
