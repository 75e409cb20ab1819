"""What every transport offers: run a command, start a long-lived one, push files, close.

The HIL backend talks to an agent process on a lab host through :class:`Channel` (newline-framed
messages over the command's stdin/stdout). Every failure is a :class:`TransportError` whose message
starts with the host, because a lab run drives several hosts and "connection refused" alone is useless.
"""

from __future__ import annotations

import hashlib
import posixpath
import queue
import re
import secrets
import shlex
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, TypeVar

from hil.inventory import HostConfig

__all__ = [
    "COMPLETE_MARKER",
    "DEFAULT_PUSH_NAME",
    "Channel",
    "CommandResult",
    "Transport",
    "TransportError",
    "content_digest",
]

DEFAULT_PUSH_NAME = "pytest-san-agent"
COMPLETE_MARKER = ".complete"  # written last: a pushed directory without it is not to be trusted
CLOSE_GRACE = 2.0  # seconds a command gets to exit on stdin EOF, then after each signal
_STDERR_KEEP = 64 * 1024  # bytes of a command's stderr kept for error messages
_STDERR_LINES = 20


class TransportError(Exception):
    """A lab host could not be reached, or a command on it failed; the message starts with the host."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host
        self.reason = message

    def __reduce__(self) -> tuple[type[TransportError], tuple[str, str]]:
        return type(self), (self.host, self.reason)  # pickles across xdist workers


@dataclass(frozen=True)
class CommandResult:
    """A finished command; output decoded as UTF-8 (undecodable bytes replaced)."""

    returncode: int
    stdout: str
    stderr: str


def describe(argv: Sequence[str] | str, limit: int = 120) -> str:
    """A command as a shell would show it, shortened for messages."""
    text = (argv if isinstance(argv, str) else shlex.join(argv)).replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Channel(ABC):
    """A started command: write to its stdin, read lines of its stdout.

    Two daemon threads drain stdout (into a queue) and stderr (keeping the tail for error messages), so
    the command never stalls on a full pipe or SSH window whatever the caller is doing.
    """

    pid: int | None = None  # the command's process id on its host, where known

    def __init__(
        self, host: str, command: str, read_stdout: Callable[[], bytes], read_stderr: Callable[[], bytes]
    ) -> None:
        self.host = host
        self.command = command
        self._chunks: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._buffer = bytearray()
        self._scanned = 0  # the first bytes of _buffer known to hold no newline: each byte is searched once
        self._eof = False
        self._stderr = bytearray()
        self._stderr_lock = threading.Lock()
        self._closed = False
        self._out_thread = _start(self._pump_stdout, read_stdout, f"{host} stdout")
        self._err_thread = _start(self._pump_stderr, read_stderr, f"{host} stderr")

    # --- reading -----------------------------------------------------------------------------------

    def readline(self, timeout: float) -> bytes:
        """The next line of stdout, newline included; TransportError on EOF or after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)  # only what the next chunk adds remains to be searched
            if self._eof:
                raise self._ended()
            self._pull(deadline, f"sent no complete line within {timeout:g} s")

    def read_to_eof(self, timeout: float) -> bytes:
        """Everything left on stdout up to EOF; TransportError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self._eof:
            self._pull(deadline, f"did not finish within {timeout:g} s")
        data = bytes(self._buffer)
        self._buffer.clear()
        self._scanned = 0
        return data

    def _pull(self, deadline: float, late: str) -> None:
        """Add the next chunk of stdout to the buffer (or note EOF); past ``deadline``, fail saying ``late``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self.error(f"`{self.command}` {late}{self._tail()}")
        try:
            chunk = self._chunks.get(timeout=remaining)
        except queue.Empty:
            return
        if chunk:
            self._buffer += chunk
        else:
            self._eof = True

    def stderr_text(self, wait: float = 0.0) -> str:
        """The kept tail of stderr; ``wait`` s for the rest of it once the command has ended."""
        self._err_thread.join(wait)
        with self._stderr_lock:
            return self._stderr.decode("utf-8", "replace")

    # --- for subclasses ----------------------------------------------------------------------------

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin."""

    @abstractmethod
    def close(self, grace: float = CLOSE_GRACE) -> None:
        """Close stdin (EOF), give the command ``grace`` s to exit, then terminate it. Idempotent."""

    @property
    @abstractmethod
    def alive(self) -> bool:
        """Whether the command is still running."""

    @abstractmethod
    def _exit_status(self, wait: float) -> int | None:
        """The exit status once known (within ``wait`` s), else None."""

    def _why_ended(self) -> str | None:
        """A reason that overrides the exit status (a lost connection), if any."""
        return None

    # --- shared helpers ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def error(self, message: str) -> TransportError:
        return TransportError(self.host, message)

    def _ended(self) -> TransportError:
        why = self._why_ended()
        if why is None:
            status = self._exit_status(wait=1.0)
            why = "it is still running" if status is None else f"exit status {status}"
        partial = f"; partial line {bytes(self._buffer[:200])!r}" if self._buffer else ""
        return self.error(f"`{self.command}` closed its output ({why}){partial}{self._tail(wait=1.0)}")

    def _tail(self, wait: float = 0.0) -> str:
        lines = self.stderr_text(wait).strip().splitlines()[-_STDERR_LINES:]
        if not lines:
            return "; stderr was empty"
        return "; last stderr lines:\n  " + "\n  ".join(lines)

    def _pump_stdout(self, read: Callable[[], bytes]) -> None:
        try:
            while chunk := read():
                self._chunks.put(chunk)
        except (OSError, ValueError, EOFError):  # closed under us: same as EOF for the reader
            pass
        finally:
            self._chunks.put(b"")

    def _pump_stderr(self, read: Callable[[], bytes]) -> None:
        try:
            while chunk := read():
                with self._stderr_lock:
                    self._stderr += chunk
                    del self._stderr[:-_STDERR_KEEP]
        except (OSError, ValueError, EOFError):
            pass


def _start(target: Callable[[Callable[[], bytes]], None], read: Callable[[], bytes], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=(read,), name=name, daemon=True)
    thread.start()
    return thread


# --- pushing files ---------------------------------------------------------------------------------


class FileOps(Protocol):
    """The few file operations ``push`` needs, on the host's side; errors are raised as OSError."""

    uid: int  # the user the transport acts as, to check who owns a directory before reusing it

    def stat(self, path: str) -> tuple[int, int] | None:
        """(owner uid, mode) of ``path``, or None if it does not exist."""

    def mkdir(self, path: str) -> None: ...

    def write(self, path: str, data: bytes) -> None: ...

    def rename(self, src: str, dst: str) -> bool:
        """Rename a directory; False if ``dst`` already exists."""

    def remove_tree(self, path: str) -> None:
        """Best effort: never raises."""


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def content_digest(files: Mapping[str, bytes]) -> str:
    """16 hex digits of SHA-256 over every path and content (length-prefixed, so no two sets collide)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        data = files[path]
        encoded = path.encode()
        digest.update(len(encoded).to_bytes(8, "big") + encoded + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:16]


def _check_paths(files: Mapping[str, bytes]) -> list[str]:
    for path in files:
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"push: paths must be relative, '/'-separated, without '.' or '..': {path!r}")
        if path == COMPLETE_MARKER:
            raise ValueError(f"push: {COMPLETE_MARKER!r} is reserved for the completion marker")
    return sorted(files)


def _parents(path: str) -> Iterator[str]:
    """'a/b/c.py' -> 'a', 'a/b'."""
    parts = path.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        yield "/".join(parts[:i])


# --- the transport ---------------------------------------------------------------------------------

_T = TypeVar("_T", bound="Transport")


class Transport(ABC):
    """A connection to one lab host. Use as a context manager; ``close`` also ends spawned commands."""

    def __init__(self, host: HostConfig, label: str) -> None:
        self.host = host
        self.label = label  # "lab1 (127.0.0.1:10022)": what every error message starts with
        self._channels: list[Channel] = []
        self._closed = False

    @property
    def remote_tmp(self) -> str:
        """Where ``push`` puts directories; the inventory variable ``san_remote_tmp`` overrides it."""
        override = self.host.extra.get("san_remote_tmp")
        return str(override) if override else self._default_tmp()

    def error(self, message: str) -> TransportError:
        return TransportError(self.label, message)

    # --- the interface -----------------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> None:
        """Establish the connection; a no-op while it is up, a fresh one after it was lost."""

    @abstractmethod
    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        """Run ``argv`` to completion (stdin empty); TransportError if it outlives ``timeout`` s."""

    def spawn(self, argv: Sequence[str]) -> Channel:
        """Start ``argv`` with binary stdin/stdout; ``close()`` of the transport ends it too."""
        self._check_open()
        if not argv:
            raise ValueError("spawn: empty argv")
        channel = self._spawn(list(argv))
        self._channels = [c for c in self._channels if not c.closed]
        self._channels.append(channel)
        return channel

    def push(self, files: Mapping[str, bytes], name: str = DEFAULT_PUSH_NAME) -> str:
        """Upload ``files`` (relative path -> content) into ``<remote tmp>/<name>-u<uid>-<digest>/``; its path.

        Each user of a host pushes to a name of their own (the uid the transport acts as), so one user's
        copy never stands in another's way. The directory is filled under a temporary name and renamed into
        place, ``.complete`` written last, so concurrent pushes of the same content (xdist workers) never
        see a half-written copy. An existing complete directory is reused untouched if it is ours and not
        writable by others: its name is predictable and anyone can create directories in /tmp.
        """
        self._check_open()
        if not _NAME.fullmatch(name):
            raise ValueError(f"push: name must be letters, digits, '.', '_' or '-': {name!r}")
        paths = _check_paths(files)
        digest = content_digest(files)
        with self._file_ops() as ops:
            final = posixpath.join(self.remote_tmp, f"{name}-u{ops.uid}-{digest}")
            if self._reusable(ops, final):
                return final
            staging = f"{final}.partial-{secrets.token_hex(4)}"
            try:
                ops.mkdir(staging)
                made: set[str] = set()
                for path in paths:
                    for parent in _parents(path):
                        if parent not in made:
                            ops.mkdir(posixpath.join(staging, parent))
                            made.add(parent)
                    ops.write(posixpath.join(staging, path), files[path])
                ops.write(posixpath.join(staging, COMPLETE_MARKER), f"{digest}\n".encode())
                if ops.rename(staging, final):
                    return final
            except BaseException:
                ops.remove_tree(staging)
                raise
            ops.remove_tree(staging)  # lost a race: another push put the same content in place
            if self._reusable(ops, final):
                return final
            raise self.error(f"{final} exists but has no {COMPLETE_MARKER} marker: remove it and retry")

    def close(self) -> None:
        """End every spawned command, then the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            for channel in reversed(self._channels):
                with suppress(TransportError):  # the connection may be gone; closing it is what matters
                    channel.close()
            self._channels.clear()
        finally:
            self._disconnect()

    def __enter__(self: _T) -> _T:
        self.connect()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- for subclasses ----------------------------------------------------------------------------

    @abstractmethod
    def _spawn(self, argv: list[str]) -> Channel: ...

    @abstractmethod
    def _disconnect(self) -> None: ...

    @abstractmethod
    def _default_tmp(self) -> str: ...

    @abstractmethod
    def _file_ops(self) -> AbstractContextManager[FileOps]:
        """File operations for ``push``; the context turns failures into TransportError."""

    def _check_open(self) -> None:
        if self._closed:
            raise self.error("transport is closed")

    def _reusable(self, ops: FileOps, final: str) -> bool:
        if ops.stat(posixpath.join(final, COMPLETE_MARKER)) is None:
            return False
        owner = ops.stat(final)
        if owner is None:
            return False
        uid, mode = owner
        if uid != ops.uid or mode & 0o022:
            raise self.error(
                f"refusing to reuse {final}: owned by uid {uid} (we are {ops.uid}), mode {mode & 0o777:o};"
                " someone else may have planted it: remove it"
            )
        return True
