"""The kernel's log as the agent's lookout for an oops: a lab's kernel code (the RDMA drivers, pytest-san's proxy
module) runs in a guest that can crash.

``KernelLogWatch`` opens /dev/kmsg at the end of the log when the agent starts, and each ``trouble()`` reads what
the kernel wrote since: an oops, a BUG, a warning with a stack, a soft lockup, a hung task, a panic. It returns
the first such report's first lines, for the controller to end the run with. Reading /dev/kmsg needs root (or
CAP_SYSLOG) where dmesg_restrict is set: without it the watch says it is unavailable, and only a dead guest's
console can tell.

Standard library only, Python 3.9+.
"""

from __future__ import annotations

import errno
import os
import re

__all__ = ["KernelLogWatch", "console_trouble", "first_trouble"]

KMSG = "/dev/kmsg"
LINES = 12  # of a report: enough for its headline, the faulting code and the top of its stack
TROUBLE = re.compile(
    r"^(?:Oops\b|BUG: |kernel BUG at|general protection fault|Kernel panic|WARNING: CPU: |"
    r"watchdog: BUG: soft lockup|INFO: task .* blocked for more than|Unable to handle kernel|"
    r"BUG: unable to handle)")


def console_trouble(text: str) -> list[str]:
    """The first lines of the first oops, BUG, warning or panic on a serial console's output (its lines carry
    the kernel's ``[   12.345678] `` time stamps, which are left out), or []."""
    lines = [re.sub(r"^\[\s*\d+\.\d+\]\s?", "", line.rstrip("\r")) for line in text.splitlines()]
    return first_trouble(lines)


def first_trouble(messages: list[str]) -> list[str]:
    """The first lines of the first oops, BUG, warning or panic among ``messages`` (the log's lines), or []."""
    for index, message in enumerate(messages):
        if TROUBLE.match(message):
            return messages[index:index + LINES]
    return []


class KernelLogWatch:
    """What the kernel logged since the watch started, read without blocking."""

    def __init__(self, path: str = KMSG) -> None:
        self.unavailable: str | None = None
        self._fd = -1
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._fd, 0, os.SEEK_END)  # only what comes from now on
        except OSError as exc:
            self.unavailable = f"{path}: {exc.strerror or exc}"
            self.close()

    def messages(self) -> list[str]:
        """The message of each record logged since the last call."""
        out: list[str] = []
        while self._fd >= 0:
            try:
                record = os.read(self._fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten before we read them: go on from here
                    continue
                if exc.errno != errno.EAGAIN:
                    self.unavailable = f"{KMSG}: {exc.strerror or exc}"
                break
            if not record:
                break
            # "level,seq,time,flags;message", then " KEY=value" lines of device properties: the message alone
            _, _, text = record.decode("utf-8", "replace").partition(";")
            out.append(text.partition("\n")[0])
        return out

    def trouble(self) -> list[str]:
        """The first lines of the first oops (BUG, warning, panic) logged since the last call, or []."""
        return first_trouble(self.messages())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
