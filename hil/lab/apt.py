"""apt for the lab: the host's own sources, or one Debian suite read beside them without touching the host.

The 6.1 lab kernel is the host's own distribution kernel (Debian 12), fetched through the host's apt. The
6.12 kernel is Debian 13's: its package lists live in a folder of the kernel cache
(``<cache>/apt/trixie/``), read with apt's ``Dir::`` options (LAB.md): the host's sources, lists, package
cache and dpkg status are never read or written, so nothing the host installs changes. Packages are only
downloaded (``apt-get download``), never installed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hil.lab import LabError

__all__ = ["HOST_APT", "KEYRING", "MIRROR", "Apt"]

MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")  # debian-archive-keyring; has trixie's keys
LISTS_MAX_AGE = 24 * 3600.0  # older lists are read again first: a kernel they name may be gone from the mirror
UPDATED = "updated"  # written after each good `apt-get update` (apt dates the lists by the archive's clock)

Runner = Callable[[Sequence[str], Path | None], subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Apt:
    """``apt-get`` / ``apt-cache`` for one source: the host's (``suite`` None) or a Debian suite of its own,
    with its state under ``state``."""

    suite: str | None = None
    state: Path | None = None

    @classmethod
    def for_suite(cls, suite: str, cache: Path) -> Apt:
        return cls(suite, cache.expanduser() / "apt" / suite)

    @property
    def name(self) -> str:
        return f"Debian {self.suite}" if self.suite else "the host's apt sources"

    def options(self) -> list[str]:
        if self.state is None:
            return []
        s = self.state
        return ["-o", f"Dir::Etc::sourcelist={s / 'sources.list'}", "-o", "Dir::Etc::sourceparts=-",
                "-o", f"Dir::State::Lists={s / 'lists'}", "-o", f"Dir::Cache={s / 'cache'}",
                "-o", f"Dir::State::status={s / 'status'}",
                # downloads land in folders of ours, which the host's _apt user may not reach: no warning
                "-o", "APT::Sandbox::User=root"]

    def argv(self, tool: str, *args: str) -> list[str]:
        return [tool, *self.options(), *args]

    @property
    def lists_name(self) -> str:
        """Whose package lists: "Debian trixie's", "the host's"."""
        return f"Debian {self.suite}'s" if self.suite else "the host's"

    def prepare(self, run: Runner, progress: Callable[[str], None], purpose: str = "") -> None:
        """The suite's package lists, read (``apt-get update``) when missing or older than a day.
        ``purpose``: what they are read for ("the 6.12 build root"), said in the progress line."""
        if self.state is None or self.suite is None:
            return
        s = self.state
        for folder in (s / "lists" / "partial", s / "cache" / "archives" / "partial"):
            folder.mkdir(parents=True, exist_ok=True)
        (s / "sources.list").write_text(f"deb [signed-by={KEYRING}] {MIRROR} {self.suite} main\n")
        (s / "status").touch()  # an empty dpkg status: nothing counts as installed
        lists = sorted((s / "lists").glob("*_Packages*"))
        stamp = s / UPDATED
        if lists and stamp.is_file() and time.time() - stamp.stat().st_mtime < LISTS_MAX_AGE:
            return
        what = f"{self.lists_name} package lists" + (f" for {purpose}" if purpose else "")
        progress(f"reading {what} into {s / 'lists'} (the host's own apt is not touched)")
        result = run(self.argv("apt-get", "update"), None)
        if result.returncode or "Err:" in result.stdout:
            why = (result.stderr.strip() or result.stdout.strip())[-800:]
            if lists:
                progress(f"reading {what} failed (apt-get update), using those of an earlier day: {why}")
                return
            raise LabError(f"cannot read {self.name}'s package lists ({MIRROR}, keyring {KEYRING}): {why}")
        if not sorted((s / "lists").glob("*_Packages*")):
            raise LabError(f"apt-get update of {self.name} wrote no package list into {s / 'lists'}")
        stamp.write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))


HOST_APT = Apt()
