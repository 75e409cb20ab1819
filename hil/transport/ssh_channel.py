"""One command on an SSH exec channel, and how its process id is learned.

Commands run without a pty, so when the controller or the connection goes away a remote command sees
EOF on stdin (the agent exits on it) instead of being left behind on the host. Each command is started
behind ``echo <marker> <nonce> $$; exec``, so that its pid can be signalled if it outlives its stdin.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from contextlib import suppress

import paramiko
from paramiko.ssh_exception import SSHException

from hil.transport.base import CLOSE_GRACE, Channel, CommandResult, TransportError

__all__ = ["KILL_TIMEOUT", "MARKER_TIMEOUT", "NET_ERRORS", "PID_MARKER", "SshChannel", "await_marker"]

NET_ERRORS = (OSError, SSHException, EOFError)  # what a dying connection raises from paramiko calls

PID_MARKER = "pytest-san-agent-pid"  # then a per-spawn nonce and the command's pid: `echo $$` before `exec`
MARKER_TIMEOUT = 10.0  # the least time a command's login gets to print the marker
_MAX_NOISE_LINES = 1000  # what a login shell may print before the marker (motd-like output, .bashrc)
_MAX_NOISE_BYTES = 1 << 20

KILL_TIMEOUT = 10.0  # for the session that signals a command: a frozen host never opens it, give up sooner


class SshChannel(Channel):
    """A remote command on an exec channel (no pty). ``pid`` is its process id on the host."""

    def __init__(self, host: str, command: str, chan: paramiko.Channel,
                 signal: Callable[[int, str, float], None]):
        self._chan = chan
        self._signal = signal
        self.login_noise = b""  # what the login shell printed before the command started (skipped)
        super().__init__(host, command, lambda: chan.recv(65536), lambda: chan.recv_stderr(65536))

    def write(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except NET_ERRORS as exc:
            why = self._why_ended() or f"{exc}"
            raise self.error(f"cannot write to `{self.command}`: {why}{self._tail(wait=1.0)}") from None

    def close(self, grace: float = CLOSE_GRACE) -> None:
        if self._closed:
            return
        self._closed = True
        chan = self._chan
        try:
            with suppress(*NET_ERRORS):
                chan.shutdown_write()  # EOF on the command's stdin: the agent exits on it
            if not chan.status_event.wait(grace) and self.pid is not None:
                for signal in ("TERM", "KILL"):
                    try:
                        self._signal(self.pid, signal, max(grace, KILL_TIMEOUT))
                    except TransportError:
                        break  # connection gone: sshd closes the command's pipes, EOF ends it
                    if chan.status_event.wait(grace):
                        break
        finally:
            chan.close()
        self._out_thread.join(grace)
        self._err_thread.join(grace)

    def collect(self, deadline: float, timeout: float) -> CommandResult:
        """For ``run``: EOF on stdin, then all output and the exit status by ``deadline``."""
        with suppress(*NET_ERRORS):
            self._chan.shutdown_write()
        try:
            out = self.read_to_eof(max(0.0, deadline - time.monotonic()))
        except TransportError:  # read_to_eof fails only on time
            raise self.error(f"`{self.command}` did not finish within {timeout:g} s; it was stopped") from None
        why = self._why_ended()
        if why is not None:
            raise self.error(f"`{self.command}`: {why}{self._tail(wait=1.0)}")
        status = self._exit_status(wait=max(1.0, deadline - time.monotonic()))
        if status is None:
            raise self.error(f"`{self.command}` sent no exit status within {timeout:g} s")
        return CommandResult(status, out.decode(errors="replace"), self.stderr_text(wait=1.0))

    @property
    def alive(self) -> bool:
        # status_event: set on exit-status, on channel close and when the connection dies
        return not self._chan.status_event.is_set()

    def _exit_status(self, wait: float) -> int | None:
        if not self._chan.status_event.wait(wait):
            return None
        return self._chan.exit_status  # -1: no exit-status (killed by a signal; paramiko ignores exit-signal)

    def _why_ended(self) -> str | None:
        # A closed channel without EOF from the server means the connection died under it (paramiko
        # closes the channels a moment before it marks the transport inactive, so check both).
        transport = self._chan.get_transport()
        lost = (self._chan.closed and not self._chan.eof_received) or not transport.is_active()
        if not lost:
            return None
        reason = transport.get_exception()
        return "the SSH connection was lost" + (f" ({reason})" if reason and str(reason) else "")


def _shown(noise: bytes | bytearray) -> str:
    """The login shell's output before the marker, for an error message."""
    return f"; the login shell printed first: {bytes(noise[:300])!r}{'...' if len(noise) > 300 else ''}"


def await_marker(channel: SshChannel, nonce: str, deadline: float,
                 fail: Callable[[str], TransportError]) -> tuple[int, bytes]:
    """(pid, what the login shell printed before it) from the first line ending in the marker.

    A login shell may print anything first (``.bashrc``, a ``command=`` in authorized_keys, a banner):
    those lines are skipped, and only a line ending in the marker with this spawn's random nonce is
    believed. A number printed by the shell must never be taken for the pid: ``close()`` signals that
    process group (with 1, a root ``kill -TERM -- -1`` would hit the whole host). What goes wrong is
    ``fail(why)``, raised.
    """
    pattern = re.compile(rb"%s %s (\d+)\r?\n\Z" % (PID_MARKER.encode(), nonce.encode()))
    noise = bytearray()
    lines = 0
    while True:
        try:
            line = channel.readline(max(0.0, deadline - time.monotonic()))
        except TransportError as exc:
            if not noise:
                raise
            raise fail(f"{exc.reason}{_shown(noise)}") from None
        found = pattern.search(line)
        if found is not None:
            break
        noise += line
        lines += 1
        if lines > _MAX_NOISE_LINES or len(noise) > _MAX_NOISE_BYTES:
            raise fail(f"`{channel.command}` did not start: the login shell printed more than"
                       f" {_MAX_NOISE_LINES} lines or {_MAX_NOISE_BYTES} bytes before the"
                       f" process id marker{_shown(noise)}")
    pid = int(found.group(1))
    if pid <= 1:  # a shell's own $$ is never 0 or 1
        raise fail(f"`{channel.command}` reported process id {pid}: refusing to signal it")
    return pid, bytes(noise)
