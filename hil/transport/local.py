"""Commands as subprocesses of the controller: ``ansible_connection: local`` hosts (and tests)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import IO

from hil.inventory import HostConfig
from hil.transport.base import (
    CLOSE_GRACE,
    Channel,
    CommandResult,
    FileOps,
    Transport,
    TransportError,
    describe,
)

__all__ = ["LocalChannel", "LocalTransport"]


class LocalChannel(Channel):
    """A subprocess with piped stdin/stdout/stderr."""

    def __init__(self, host: str, argv: list[str]) -> None:
        try:
            # A new session, as sshd gives its commands: the terminal's Ctrl-C reaches the controller,
            # which then closes stdin, rather than killing the agent in the middle of a message.
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(host, f"cannot start `{describe(argv)}`: {exc.strerror or exc}") from None
        self.pid = self._proc.pid
        stdout, stderr = _pipe(self._proc.stdout), _pipe(self._proc.stderr)
        super().__init__(host, describe(argv), lambda: stdout.read(65536) or b"", lambda: stderr.read(65536) or b"")

    def write(self, data: bytes) -> None:
        stdin = _pipe(self._proc.stdin)
        try:
            stdin.write(data)
            stdin.flush()
        except (OSError, ValueError):  # BrokenPipeError: it exited; ValueError: we closed stdin
            status = self._exit_status(wait=1.0)
            state = "closed" if status is None else f"exited with status {status}"
            raise self.error(f"cannot write to `{self.command}`: it {state}{self._tail(wait=1.0)}") from None

    def close(self, grace: float = CLOSE_GRACE) -> None:
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        with suppress(OSError):  # already gone
            _pipe(proc.stdin).close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)  # its own process group (new session): children go too
            try:
                proc.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self._out_thread.join(grace)  # EOF follows unless a grandchild holds the pipe
        self._err_thread.join(grace)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _exit_status(self, wait: float) -> int | None:
        try:
            return self._proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None


def _text(data: bytes) -> str:
    return data.decode(errors="replace")


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    assert stream is not None, "Popen was asked for every pipe"
    return stream


class _LocalOps:
    def __init__(self) -> None:
        self.uid = os.getuid()

    def stat(self, path: str, follow: bool = False) -> tuple[int, int] | None:
        try:
            st = os.stat(path, follow_symlinks=follow)
        except FileNotFoundError:
            return None
        return st.st_uid, st.st_mode

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def read(self, path: str, limit: int) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read(limit)
        except FileNotFoundError:
            return None

    def names(self, directory: str) -> list[str]:
        return os.listdir(directory)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, 0o700)

    def write(self, path: str, data: bytes) -> None:
        with open(path, "xb") as f:  # close() raises what a lost write-back reports
            f.write(data)

    def rename(self, src: str, dst: str) -> bool:
        try:
            os.rename(src, dst)  # a directory replaces only an empty directory: a complete one stays
        except OSError:
            if os.path.lexists(dst):
                return False
            raise
        return True

    def remove_tree(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with suppress(OSError):
                os.unlink(path)

    def owner_name(self, path: str, uid: int) -> str | None:
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return None


def _on_path(name: str) -> bool:
    """Whether a directory of PATH that we may search holds a file ``name``."""
    return any(os.path.isfile(os.path.join(d, name)) for d in os.environ.get("PATH", os.defpath).split(os.pathsep)
               if d and os.access(d, os.X_OK))


class LocalTransport(Transport):
    """Runs everything on this machine, with the same semantics as :class:`SshTransport`."""

    def __init__(self, host: HostConfig) -> None:
        super().__init__(host, f"{host.name} (local)")

    def connect(self) -> None:
        self._check_open()

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        self._check_open()
        try:
            done = subprocess.run(list(argv), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise self.error(f"`{describe(argv)}` did not finish within {timeout:g} s; it was stopped") from None
        except FileNotFoundError:
            # What a shell (and so the SSH transport) reports for a missing program.
            return CommandResult(127, "", f"{argv[0]}: command not found\n")
        except PermissionError:
            # A directory of PATH we may not search (another user's), or a file we may not run: a shell
            # passes over the first (command not found, 127) and reports the second (126).
            if "/" not in argv[0] and not _on_path(argv[0]):
                return CommandResult(127, "", f"{argv[0]}: command not found\n")
            return CommandResult(126, "", f"{argv[0]}: Permission denied\n")
        except OSError as exc:
            raise self.error(f"cannot run `{describe(argv)}`: {exc.strerror or exc}") from None
        return CommandResult(done.returncode, _text(done.stdout), _text(done.stderr))

    def _spawn(self, argv: list[str]) -> Channel:
        return LocalChannel(self.label, argv)

    def _disconnect(self) -> None:
        pass

    def _default_tmp(self) -> str:
        return tempfile.gettempdir()

    @contextmanager
    def _file_ops(self) -> Iterator[FileOps]:
        try:
            yield _LocalOps()
        except OSError as exc:
            raise self.error(f"push failed: {exc}") from None
