"""A lab's processes: which belong to it (command lines that name its state directory, compared as paths),
their process groups, and stopping them.

Every process of the lab leads its own session (vng and the qemu it execs through a shell share it), so
stopping a lab means signalling process groups.

A lab's processes name its state directory: the hub its port file, vng (the leader of a guest's process
group) the init script in its ``--exec`` command, qemu the same script inside the base64 ``virtme.exec``
of its kernel command line. "Names" means an argument, a word of one (``--exec`` and ``sh -c`` carry
whole command lines) or a value after ``=`` or ``,`` is the directory or a path below it: ``/tmp/lab``
never matches ``/tmp/lab2``. A recorded process group is the lab's only while its leader names the
directory (a stale state's pgid may lead someone else's processes now); a group whose leader has exited
keeps its id until its last member exits, so its members are asked instead.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import shlex
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["ancestors", "argv_of", "group_is_ours", "group_members", "leftovers", "names_dir", "pid_alive",
           "stop_group", "temp_files"]

_VIRTME_EXEC = re.compile(r"virtme\.exec=`([A-Za-z0-9+/=]+)`")
# vng's temp file (tempfile.mkstemp(prefix="virtme_ret")): qemu writes the guest's exit status into it
# through a chardev, and vng removes it only when it exits normally.
_VIRTME_RET = re.compile(r"(?:^|[\s=,])(/[^\s,]*/virtme_ret\w+)")
_DEPTH = 4  # command lines inside command lines: sh -c "virtme-run --script-sh '/bin/bash <init> ...'"


def argv_of(pid: int) -> list[str] | None:
    """Process ``pid``'s arguments, or None if it is gone (or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1]] if raw else []


def _words(text: str, depth: int = 0) -> Iterator[str]:
    """``text``, its shell words, the values after its ``=`` and ``,``, and any decoded ``virtme.exec``."""
    yield text
    if depth >= _DEPTH:
        return
    for encoded in _VIRTME_EXEC.findall(text):
        try:
            decoded = base64.b64decode(encoded, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            continue
        yield from _words(decoded, depth + 1)
    if any(c.isspace() for c in text):
        try:
            parts = shlex.split(text)
        except ValueError:  # an unbalanced quote: plain words will do
            parts = text.split()
        for part in parts:
            if part != text:
                yield from _words(part, depth + 1)
    else:
        yield from re.split(r"[=,]", text)[1:]


def _under(word: str, directory: str) -> bool:
    if not word.startswith("/"):
        return False
    path = os.path.normpath(word)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def names_dir(argv: Sequence[str], directory: str | Path) -> bool:
    """Whether a command line names ``directory`` (or a path below it) as a path, not as a substring."""
    root = os.path.normpath(os.path.abspath(directory))
    return any(_under(word, root) for arg in argv for word in _words(arg))


# --- process groups ---------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """Running (a zombie does not count: it has exited, only its parent has not looked yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _reap(pid: int) -> None:
    # When up and down run in one process (lab run, tests), the guests are our children: collect them.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every live process in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append((int(entry.name), comm))
    return sorted(members)


def stop_group(pgid: int, grace: float = 5.0) -> list[tuple[int, str]]:
    """SIGTERM the group, SIGKILL what is left after ``grace`` s; returns what survived both (nothing)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(pgid)
            if not group_members(pgid):
                break
            time.sleep(0.1)
    _reap(pgid)
    return group_members(pgid)


def group_is_ours(pgid: int, directory: str | Path) -> bool:
    """Whether process group ``pgid`` still runs the lab in ``directory``, judged by its leader's command line.

    Without a live leader, the group id cannot have been handed out again: it is the lab's if one of its
    members names the directory.
    """
    members = [pid for pid, _ in group_members(pgid)]
    if not members:
        return False
    if pgid in members:
        argv = argv_of(pgid)
        return argv is not None and names_dir(argv, directory)
    return any(names_dir(argv_of(pid) or [], directory) for pid in members)


def temp_files(pgid: int) -> list[str]:
    """vng's temp files that group ``pgid``'s processes name on their command lines or hold open."""
    found: list[str] = []
    for pid, _ in group_members(pgid):
        names = _VIRTME_RET.findall(" ".join(argv_of(pid) or []))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/") and os.path.basename(target).startswith("virtme_ret"):
                names.append(target)
        found += [name for name in names if name not in found and not name.endswith(" (deleted)")]
    return found


def ancestors() -> set[int]:
    """This process and its parents: `timeout 60 san-hil lab down --state-dir X` names X too."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def leftovers(directory: str | Path) -> list[str]:
    """Processes (not this one or its parents) still naming the lab's directory, as ``pid (command)``."""
    mine = ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        argv = argv_of(int(entry.name))
        if argv and names_dir(argv, directory) and pid_alive(int(entry.name)):
            found.append(f"{entry.name} ({' '.join(argv)[:100].strip()})")
    return found
