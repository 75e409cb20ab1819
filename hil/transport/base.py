"""What every transport offers: run a command, start a long-lived one, push files, close.

The HIL backend talks to an agent process on a lab host through :class:`Channel` (newline-framed
messages over the command's stdin/stdout). Every failure is a :class:`TransportError` whose message
starts with the host, because a lab run drives several hosts and "connection refused" alone is useless.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import queue
import re
import secrets
import shlex
import stat
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
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

log = logging.getLogger(__name__)  # an agent directory replaced, or another user's name passed over


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

    def read_chunk(self, timeout: float) -> bytes | None:
        """What stdout sent that was not read yet, as it comes (no line framing: a live stream of output);
        waits up to ``timeout`` s for some. ``b""`` at EOF, None if nothing came in time."""
        if not self._buffer and not self._eof:
            try:
                chunk = self._chunks.get(timeout=max(0.0, timeout))
            except queue.Empty:
                return None
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True
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
    """The few file operations ``push`` needs, on the host's side.

    Failures are OSError with the errno of the host's failure where it can be learned (SFTP carries
    none for a full or read-only file system: the SFTP side asks the file system) and the path.
    """

    uid: int  # the user the transport acts as, to check who owns a directory before reusing it

    def stat(self, path: str, follow: bool = False) -> tuple[int, int] | None:
        """(owner uid, mode) of ``path`` (of what a symlink points to, if ``follow``), None if missing."""

    def realpath(self, path: str) -> str: ...

    def read(self, path: str, limit: int) -> bytes | None:
        """Up to ``limit`` bytes of a file, None if it does not exist."""

    def names(self, directory: str) -> list[str]: ...

    def mkdir(self, path: str) -> None: ...

    def write(self, path: str, data: bytes) -> None:
        """Create ``path`` (it must not exist) holding ``data``, every byte of it checked as written."""

    def rename(self, src: str, dst: str) -> bool:
        """Rename a directory; False if ``dst`` already exists."""

    def remove_tree(self, path: str) -> None:
        """Best effort: never raises."""

    def owner_name(self, path: str, uid: int) -> str | None:
        """The user name of ``uid`` (the owner of ``path``) on the host, if it can be learned."""


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_OWN_SUFFIX = re.compile(r"-[0-9a-f]{8}")  # a fallback name of our own: <name>-u<uid>-<digest>-<8 hex>
_PUSH_ATTEMPTS = 3  # a name taken (by another user, or a racing push) between our check and our rename


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


def os_error_words(exc: OSError) -> str:
    """An OSError as its errno in words ("no space left on device"), else its message."""
    if exc.errno:
        words = os.strerror(exc.errno)
        return words[:1].lower() + words[1:]
    text = exc.strerror or (str(exc.args[0]) if exc.args else "") or type(exc).__name__
    return str(text)


@dataclass(frozen=True)
class _Found:
    """What is at an agent directory's name: ``state`` is missing, good, bad (ours, unusable) or theirs."""

    state: str
    why: str = ""
    uid: int = -1


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
        copy never stands in another's way. The directory is filled under a temporary name, every write
        checked, ``.complete`` (holding the digest) written last, and renamed into place, so concurrent
        pushes of the same content (xdist workers) never see a half-written copy. An existing directory is
        reused untouched only if it is ours, not writable by others and its ``.complete`` holds the digest;
        one of ours that fails this is replaced. Its name is predictable and anyone can create directories
        in /tmp: a name another user took is passed over for one of our own (``<name>-u<uid>-<digest>-<8
        hex>``), never shared. The remote tmp must be an existing absolute directory that no other user can
        rename things in (every directory up to / sticky or writable only by its owner).
        """
        self._check_open()
        if not _NAME.fullmatch(name):
            raise ValueError(f"push: name must be letters, digits, '.', '_' or '-': {name!r}")
        paths = _check_paths(files)
        digest = content_digest(files)
        with self._file_ops() as ops:
            tmp = self._checked_tmp(ops)
            base = f"{name}-u{ops.uid}-{digest}"
            final = posixpath.join(tmp, base)
            for _ in range(_PUSH_ATTEMPTS):
                found = self._inspect(ops, final, digest)
                if found.state == "theirs":
                    final, found = self._own_name(ops, tmp, base, digest, final, found)
                if found.state == "good":
                    return final
                if found.state == "bad":
                    self._discard(ops, final, found.why)
                if self._fill(ops, final, paths, files, digest):
                    return final
                # Lost a race: another push (or another user) put something under that name first.
            found = self._inspect(ops, final, digest)
            if found.state == "good":
                return final
            raise self.error(f"push failed: {final} keeps being taken ({self._what(ops, final, found)})")

    def _fill(self, ops: FileOps, final: str, paths: list[str], files: Mapping[str, bytes], digest: str) -> bool:
        """Write ``files`` under a temporary name and rename it to ``final``: False if that name was taken."""
        staging = f"{final}.partial-{secrets.token_hex(4)}"
        try:
            with self._step("create directory", staging):
                ops.mkdir(staging)
            made: set[str] = set()
            for path in paths:
                for parent in _parents(path):
                    if parent not in made:
                        where = posixpath.join(staging, parent)
                        with self._step("create directory", where):
                            ops.mkdir(where)
                        made.add(parent)
                where = posixpath.join(staging, path)
                with self._step("write", where):
                    ops.write(where, files[path])
            where = posixpath.join(staging, COMPLETE_MARKER)
            with self._step("write", where):
                ops.write(where, f"{digest}\n".encode())
            with self._step("rename", f"{staging} to {final}"):
                if ops.rename(staging, final):
                    return True
        except BaseException:
            ops.remove_tree(staging)
            raise
        ops.remove_tree(staging)
        return False

    @contextmanager
    def _step(self, verb: str, path: str) -> Iterator[None]:
        """An OSError of one push step as a TransportError naming the step, the path and the errno in words."""
        try:
            yield
        except OSError as exc:
            raise self.error(f"push failed: cannot {verb} {path}: {os_error_words(exc)}") from None

    def _checked_tmp(self, ops: FileOps) -> str:
        """The remote tmp, if it is an absolute path to a directory no other user can rename things in."""
        override = self.host.extra.get("san_remote_tmp")
        what = f"san_remote_tmp {override!r}" if override else "the remote tmp"
        tmp = self.remote_tmp
        if not posixpath.isabs(tmp):
            raise self.error(f"{what} is a relative path: give an absolute directory on the host")
        with self._step("inspect", tmp):
            found = ops.stat(tmp, follow=True)
            if found is None:
                raise self.error(f"{what} does not exist on the host: create it or point san_remote_tmp elsewhere")
            if not stat.S_ISDIR(found[1]):
                raise self.error(f"{what} is not a directory on the host: point san_remote_tmp at a directory")
            real = ops.realpath(tmp)
            chain = [real]
            while chain[-1] != "/":
                chain.append(posixpath.dirname(chain[-1]))
            for directory in chain:
                mode = (ops.stat(directory, follow=True) or (0, 0))[1]
                if mode & 0o022 and not mode & stat.S_ISVTX:
                    who = "others" if mode & 0o002 else "its group"
                    raise self.error(
                        f"{what}: {directory} is writable by {who} and not sticky (mode {mode & 0o7777:o}):"
                        f" another user could move the agent's directory away and put theirs in its place;"
                        f" chmod +t {directory}, or set san_remote_tmp to a directory only you can write"
                    )
        return posixpath.normpath(tmp)

    def _inspect(self, ops: FileOps, final: str, digest: str) -> _Found:
        with self._step("inspect", final):
            found = ops.stat(final)
            if found is None:
                return _Found("missing")
            uid, mode = found
            if uid != ops.uid:
                return _Found("theirs", uid=uid)
            if not stat.S_ISDIR(mode):
                return _Found("bad", "it is not a directory", uid)
            if mode & 0o022:
                return _Found("bad", f"it is writable by others (mode {mode & 0o7777:o})", uid)
            marker = posixpath.join(final, COMPLETE_MARKER)
            content = ops.read(marker, 64)
        if content is None:
            return _Found("bad", f"it has no {COMPLETE_MARKER} (a push that died half-way)", uid)
        if content != f"{digest}\n".encode():
            return _Found("bad", f"its {COMPLETE_MARKER} holds {content[:40]!r}, not the digest {digest}"
                          " (a push that failed, or a file system that lost writes)", uid)
        return _Found("good", uid=uid)

    def _what(self, ops: FileOps, path: str, found: _Found) -> str:
        if found.state != "theirs":
            return found.why or found.state
        user = ops.owner_name(path, found.uid)
        return f"owned by uid {found.uid} ({user or 'no user name known'}), not by us (uid {ops.uid})"

    def _discard(self, ops: FileOps, path: str, why: str) -> None:
        """Replace one of our directories that cannot be reused: moved aside first (so that a racing push
        that just put a good copy in place loses at most its rename), then removed."""
        log.warning("%s: replacing %s: %s", self.label, path, why)
        aside = f"{path}.stale-{secrets.token_hex(4)}"
        try:
            moved = ops.rename(path, aside)
        except OSError as exc:
            if ops.stat(path) is None:
                return  # a racing push moved it first
            raise self.error(f"push failed: cannot move {path} aside to replace it: {os_error_words(exc)}") from None
        if moved:
            ops.remove_tree(aside)

    def _own_name(self, ops: FileOps, tmp: str, base: str, digest: str, taken: str,
                  found: _Found) -> tuple[str, _Found]:
        """Another user holds ``taken``: a good copy of ours under a suffixed name, else a new such name."""
        log.warning("%s: not using %s: %s; pushing to a name of our own", self.label, taken,
                    self._what(ops, taken, found))
        try:
            listed = ops.names(tmp)
        except OSError:  # a directory we may write to but not list (mode 1733): a new name each time, then
            listed = []
        names = sorted(n for n in listed if n.startswith(base) and _OWN_SUFFIX.fullmatch(n[len(base):]))
        for candidate in names:
            path = posixpath.join(tmp, candidate)
            found = self._inspect(ops, path, digest)
            if found.state == "good":
                return path, found
            if found.state == "bad":
                self._discard(ops, path, found.why)
        return posixpath.join(tmp, f"{base}-{secrets.token_hex(4)}"), _Found("missing")

    def fetch(self, path: str, limit: int = 1 << 30) -> bytes | None:
        """The content of the file ``path`` on the host (at most ``limit`` bytes); None if there is none."""
        self._check_open()
        with self._file_ops() as ops, self._step("read", path):
            return ops.read(path, limit)

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
