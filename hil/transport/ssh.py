"""SSH to a lab host with paramiko: ~/.ssh/config, ProxyJump, strict host keys, keys only.

:class:`SshTransport` connects (through each ProxyJump hop in turn), runs and spawns commands, and
pushes files over SFTP. Where it connects is :mod:`~hil.transport.ssh_config`; which keys it offers and
which host keys it trusts, :mod:`~hil.transport.ssh_auth`; one command, :mod:`~hil.transport.ssh_channel`.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import secrets
import select
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import paramiko
from paramiko.sftp import CMD_EXTENDED, CMD_EXTENDED_REPLY
from paramiko.ssh_exception import ChannelException, SSHException

from hil.inventory import HostConfig
from hil.transport.base import Channel, CommandResult, FileOps, Transport, TransportError, describe
from hil.transport.ssh_auth import (
    KNOWN_HOSTS_ERRORS,
    OfferKeys,
    UnknownHostKey,
    explain,
    keys_to_offer,
    read_config,
    strict_client,
)
from hil.transport.ssh_channel import KILL_TIMEOUT, MARKER_TIMEOUT, NET_ERRORS, PID_MARKER, SshChannel, await_marker
from hil.transport.ssh_config import (
    DEFAULT_KNOWN_HOSTS,
    DEFAULT_SSH_CONFIG,
    Endpoint,
    hostport,
    jump_chain,
    target,
)

__all__ = [
    "DEFAULT_KNOWN_HOSTS",
    "DEFAULT_SSH_CONFIG",
    "KILL_TIMEOUT",
    "MARKER_TIMEOUT",
    "PID_MARKER",
    "SshChannel",
    "SshTransport",
    "kill_script",
    "posix_sh",
]


log = logging.getLogger(__name__)  # SSH connections opened, authenticated, lost and closed


# --- file operations for push ----------------------------------------------------------------------


_ST_RDONLY = 1  # statvfs f_flag: mounted read-only
_STATVFS = "statvfs@openssh.com"  # OpenSSH's extension: SFTP's own statuses carry no errno


class _SftpOps:
    """``push``'s file operations over SFTP, every write checked.

    OpenSSH's sftp-server answers most failures, a full or read-only file system among them, with a bare
    "Failure": where it does, the file system is asked (``statvfs@openssh.com``) what is wrong, so that the
    error says "no space left on device" or "read-only file system".
    """

    def __init__(self, sftp: paramiko.SFTPClient, uid: int) -> None:
        self._sftp = sftp
        self.uid = uid

    def stat(self, path: str, follow: bool = False) -> tuple[int, int] | None:
        try:
            st = self._sftp.stat(path) if follow else self._sftp.lstat(path)
        except FileNotFoundError:
            return None
        return (-1 if st.st_uid is None else st.st_uid), st.st_mode or 0

    def realpath(self, path: str) -> str:
        return self._sftp.normalize(path)

    def read(self, path: str, limit: int) -> bytes | None:
        try:
            with self._sftp.open(path, "rb") as f:
                return f.read(limit)
        except FileNotFoundError:
            return None

    def names(self, directory: str) -> list[str]:
        return self._sftp.listdir(directory)

    def mkdir(self, path: str) -> None:
        try:
            self._sftp.mkdir(path, 0o700)
        except OSError as exc:
            raise self._explained(exc, path, 1) from None

    def write(self, path: str, data: bytes) -> None:
        # Not pipelined: paramiko drops the status of a pipelined WRITE, and of every CLOSE, so a full
        # disk gave empty files and a "successful" push. Each WRITE's status is read; the size check
        # catches what the CLOSE status would have said.
        try:
            with self._sftp.open(path, "wbx") as f:  # x: O_EXCL
                f.write(data)
            size = self._sftp.stat(path).st_size
        except OSError as exc:
            raise self._explained(exc, path, len(data)) from None
        if size != len(data):
            found = self._explained(OSError(f"{size} of {len(data)} bytes kept after writing"), path, len(data))
            raise OSError(found.errno, f"{found.strerror or found}; {size} of {len(data)} bytes were kept")

    def rename(self, src: str, dst: str) -> bool:
        try:
            self._sftp.rename(src, dst)  # OpenSSH's sftp-server refuses to replace an existing directory
        except OSError as exc:
            if self.stat(dst) is not None:
                return False
            raise self._explained(exc, src, 0) from None
        return True

    def remove_tree(self, path: str) -> None:
        try:
            if not stat.S_ISDIR(self._sftp.lstat(path).st_mode or 0):
                self._sftp.remove(path)  # what a replaced name held may be a file or a link
                return
            for entry in self._sftp.listdir_attr(path):
                child = f"{path}/{entry.filename}"
                if stat.S_ISDIR(entry.st_mode or 0):
                    self.remove_tree(child)
                else:
                    self._sftp.remove(child)
            self._sftp.rmdir(path)
        except NET_ERRORS:
            pass

    def owner_name(self, path: str, uid: int) -> str | None:
        # SFTP gives uids; sftp-server's long listing ("drwx------ 2 alice alice ...") names them.
        parent, name = posixpath.split(path)
        try:
            for entry in self._sftp.listdir_attr(parent or "/"):
                fields = entry.longname.split()
                if entry.filename == name and entry.st_uid == uid and len(fields) > 2 and not fields[2].isdigit():
                    return fields[2]
        except NET_ERRORS:
            pass
        return None

    def _explained(self, exc: OSError, path: str, need: int) -> OSError:
        """``exc`` with an errno, if SFTP gave none and the file system says why: read-only, or full."""
        if exc.errno:
            return OSError(exc.errno, os.strerror(exc.errno), path)
        fs = self._statvfs(posixpath.dirname(path) or "/")
        if fs is not None:
            frsize, bavail, favail, flag = fs
            if flag & _ST_RDONLY:
                return OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            if bavail * frsize < max(need, 1) or favail == 0:
                return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            room = f"; {bavail * frsize // 1024} KiB free there"
        else:
            room = ""
        text = str(exc.args[0]) if exc.args else type(exc).__name__
        return OSError(None, f"the SFTP server said {text!r}, without a reason{room}", path)

    def _statvfs(self, path: str) -> tuple[int, int, int, int] | None:
        """(fragment size, blocks free to us, inodes free to us, flags) of the file system holding ``path``."""
        try:
            # paramiko has no public call for extensions (and its stubs do not know this one)
            request: Callable[..., tuple[int, paramiko.Message]] = getattr(self._sftp, "_request")  # noqa: B009
            kind, msg = request(CMD_EXTENDED, _STATVFS, path)
            if kind != CMD_EXTENDED_REPLY:
                return None
            fields = [msg.get_int64() for _ in range(11)]  # bsize frsize blocks bfree bavail files ffree favail
        except (*NET_ERRORS, AttributeError, TypeError, ValueError):  # fsid flag namemax
            return None
        return fields[1], fields[4], fields[7], fields[9]


# --- the transport ---------------------------------------------------------------------------------

def posix_sh(script: str) -> str:
    """What the login shell is asked to run for ``script``: /bin/sh runs it, whatever the login shell.

    sshd hands every command to the user's login shell, which may be dash, bash, busybox sh, or no POSIX
    shell at all: it only has to ``exec`` (so the pid, the session leader's, stays) /bin/sh with one
    single-quoted word. ``script`` is POSIX sh.
    """
    return f"exec /bin/sh -c {shlex.quote(script)}"


def kill_script(pid: int, signal: str) -> str:
    """POSIX sh that sends ``signal`` (TERM, KILL) to the process group ``pid`` leads (sshd starts each command
    in a new session), or to ``pid`` alone if that fails.

    ``kill -SIG -PID`` is the one form dash, bash, busybox sh, ksh and zsh all take: dash refuses
    ``kill -SIG -- -PID`` and busybox ``kill -s SIG -- -PID`` (under dash the group lived on). A stopped
    command (SIGSTOP) acts on TERM only once continued: CONT lets it clean up rather than wait for KILL.
    """
    script = f"kill -{signal} -{pid} 2>/dev/null || kill -{signal} {pid}"
    if signal == "TERM":
        script += f"; kill -CONT -{pid} 2>/dev/null || kill -CONT {pid}"
    return script


JOIN_TIMEOUT = 5.0  # seconds a closed connection's paramiko thread gets to end (its socket is closed: it does)


def _close_clients(clients: Sequence[paramiko.SSHClient]) -> None:
    """Close the target, then the hops it tunnels through, and wait for each paramiko thread to end.

    ``SSHClient.close`` does not wait for it (nor close anything once the thread has failed), and the
    thread logs, tracebacks included, on its way out: after close, nothing of ours is left running.
    """
    for client in reversed(clients):
        transport = client.get_transport()
        client.close()
        if transport is None:
            continue
        with suppress(OSError):
            transport.sock.close()  # a thread that failed on its own leaves its socket to close()
        if transport.is_alive() and transport is not threading.current_thread():
            transport.join(JOIN_TIMEOUT)
            if transport.is_alive():
                log.warning("paramiko thread %s did not end within %g s of closing", transport.name, JOIN_TIMEOUT)



class SshTransport(Transport):
    """A lab host over SSH. Timeouts in seconds; ``ssh_config=None`` ignores ~/.ssh/config."""

    def __init__(
        self,
        host: HostConfig,
        *,
        connect_timeout: float = 10.0,
        banner_timeout: float = 15.0,
        auth_timeout: float = 30.0,
        channel_timeout: float = 30.0,
        keepalive: float = 15.0,
        ssh_config: Path | None = DEFAULT_SSH_CONFIG,
    ) -> None:
        super().__init__(host, f"{host.name} ({hostport(host.host, host.port)})")
        self.connect_timeout = connect_timeout
        self.banner_timeout = banner_timeout
        self.auth_timeout = auth_timeout
        self.channel_timeout = channel_timeout
        self.keepalive = keepalive
        self.known_hosts = (host.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
        self._config_path = ssh_config.expanduser() if ssh_config else None
        try:
            lookup = read_config(self._config_path)
        except (OSError, SSHException, ValueError) as exc:
            raise self.error(f"cannot read {self._config_path}: {exc}") from None
        try:
            self._target, jump = target(host, lookup)
            self._hops = jump_chain(host, jump, lookup)
        except ValueError as exc:
            raise self.error(f"{self._config_path}: {exc}") from None
        self.label = f"{host.name} ({self._target.at})"  # the address actually dialled
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the target last
        self._uid: int | None = None
        self._lock = threading.Lock()

    @property
    def paramiko_transport(self) -> paramiko.Transport | None:
        """The connection to the target (for diagnostics and tests)."""
        return self._clients[-1].get_transport() if self._clients else None

    @property
    def jump_hosts(self) -> tuple[str, ...]:
        """``host:port`` of each ProxyJump hop, in connection order."""
        return tuple(hop.at for hop in self._hops)

    # --- connecting --------------------------------------------------------------------------------

    def connect(self) -> None:
        self._check_open()
        with self._lock:
            if self._clients:
                transport = self._clients[-1].get_transport()
                if transport is not None and transport.is_active():
                    return
                _close_clients(self._clients)  # lost (host rebooted?): connect afresh
                self._clients = []
            clients: list[paramiko.SSHClient] = []
            try:
                previous: Endpoint | None = None
                for ep in (*self._hops, self._target):
                    sock = self._tunnel(clients[-1], previous, ep) if previous else None
                    clients.append(self._connect_one(ep, sock, self._prefix(ep)))
                    previous = ep
            except BaseException:
                _close_clients(clients)
                raise
            self._clients = clients
            via = f" through {', '.join(self.jump_hosts)}" if self._hops else ""
            log.info("%s: SSH connected as %s%s", self.label, self._target.user, via)

    def _prefix(self, ep: Endpoint) -> str:
        return "" if ep is self._target else f"jump host {ep.alias} ({ep.at}): "

    def _tunnel(self, client: paramiko.SSHClient, via: Endpoint, ep: Endpoint) -> paramiko.Channel:
        """A direct-tcpip channel from the jump host ``via`` to ``ep``: the socket for the next hop."""
        transport = client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=self.channel_timeout
            )
        except ChannelException as exc:
            raise self.error(
                f"{self._prefix(via)}could not open a connection to {ep.at}: {exc.text}"
                " (AllowTcpForwarding off there, or the next host unreachable from it)"
            ) from None
        except NET_ERRORS as exc:
            raise self.error(f"{self._prefix(via)}connection lost while opening a tunnel to {ep.at}: {exc}") from None

    def _connect_one(self, ep: Endpoint, sock: paramiko.Channel | None, prefix: str) -> paramiko.SSHClient:
        try:
            client = strict_client(self.known_hosts)
        except KNOWN_HOSTS_ERRORS as exc:
            raise self.error(f"cannot read known hosts {self.known_hosts}: {exc}") from None
        offered, notes, agent = keys_to_offer(ep, lambda why: self.error(prefix + why))
        log.debug("%s: %sconnecting to %s as %s, offering %s%s", self.label, prefix, ep.at, ep.user,
                  ", ".join(d for d, _ in offered) or "no key", f" ({'; '.join(notes)})" if notes else "")
        try:
            # Our own socket, on which the banner is awaited before paramiko starts its thread: on a port
            # that never speaks SSH, paramiko gave up the handshake before its banner wait ended ("No existing
            # session") and its thread, still waiting, later logged a traceback -- which, while pytest parsed
            # a test's source, crashed it (ast's recursion depth is not per thread in Python 3.11).
            line = self._await_banner(ep, sock if sock is not None else self._dial(ep))
            client.connect(
                ep.hostname,
                ep.port,
                timeout=self.connect_timeout,  # the key exchange, once the banner is in
                sock=line,
                banner_timeout=self.banner_timeout,
                auth_timeout=self.auth_timeout,
                channel_timeout=self.channel_timeout,
                auth_strategy=OfferKeys(ep.user, [key for _, key in offered]),
            )
        except TransportError:
            _close_clients([client])
            raise
        except (*NET_ERRORS, UnknownHostKey) as exc:
            _close_clients([client])
            why = explain(exc, ep, [d for d, _ in offered], notes, known_hosts=self.known_hosts,
                          connect_timeout=self.connect_timeout, banner_timeout=self.banner_timeout)
            log.warning("%s: %s%s", self.label, prefix, why)
            raise self.error(prefix + why) from None
        except BaseException:
            _close_clients([client])
            raise
        finally:
            if agent is not None:
                agent.close()
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, round(self.keepalive)))  # keeps NAT/firewall state alive
        log.debug("%s: %sauthenticated as %s by public key", self.label, prefix, transport.get_username())
        return client

    def _fail(self, ep: Endpoint, why: str) -> TransportError:
        log.warning("%s: %s%s", self.label, self._prefix(ep), why)
        return self.error(self._prefix(ep) + why)

    def _dial(self, ep: Endpoint) -> socket.socket:
        try:
            return socket.create_connection((ep.hostname, ep.port), timeout=self.connect_timeout)
        except OSError as exc:
            why = explain(exc, ep, [], [], known_hosts=self.known_hosts, connect_timeout=self.connect_timeout,
                          banner_timeout=self.banner_timeout)
            raise self._fail(ep, why) from None

    def _await_banner(self, ep: Endpoint, sock: socket.socket | paramiko.Channel) -> socket.socket | paramiko.Channel:
        """``sock`` once the server has sent something (its banner), or TransportError after banner_timeout."""
        try:
            ready, _, _ = select.select([sock], [], [], self.banner_timeout)
        except (OSError, ValueError) as exc:
            sock.close()
            raise self._fail(ep, f"connection to {ep.at} lost before its SSH banner: {exc}") from None
        if not ready:
            sock.close()
            raise self._fail(ep, f"no SSH banner from {ep.at} within {self.banner_timeout:g} s"
                                 " (not an SSH server, or one too busy to answer)")
        return sock

    # --- commands ----------------------------------------------------------------------------------

    def _active(self, closing: bool = False) -> paramiko.Transport:
        if not closing:  # close() still signals the commands it ends
            self._check_open()
        transport = self.paramiko_transport
        if transport is None:
            raise self.error("not connected: call connect() first")
        if not transport.is_active():
            reason = transport.get_exception()
            log.warning("%s: the SSH connection was lost%s", self.label, f" ({reason})" if reason else "")
            raise self.error("the SSH connection was lost" + (f" ({reason})" if reason else ""))
        return transport

    def _open(self, command: str, timeout: float | None = None, closing: bool = False) -> paramiko.Channel:
        transport = self._active(closing)
        # A frozen or vanished host never answers the open: wait no longer than the caller allows.
        wait = self.channel_timeout if timeout is None else min(timeout, self.channel_timeout)
        try:
            chan = transport.open_session(timeout=wait)
        except NET_ERRORS as exc:
            raise self.error(f"cannot open a session for `{describe(command)}`: {exc}") from None
        try:
            chan.exec_command(command)
        except NET_ERRORS as exc:
            chan.close()
            raise self.error(f"the server refused to run `{describe(command)}`: {exc}") from None
        return chan

    def _start(self, argv: Sequence[str], timeout: float) -> SshChannel:
        """Run ``argv`` behind ``echo <marker> $$; exec``: the marker line gives its pid, to signal it
        (:func:`~hil.transport.ssh_channel.await_marker` says which line is believed)."""
        command = shlex.join(argv)
        nonce = secrets.token_hex(8)
        # However short the caller's timeout, the pid is worth waiting for: without it a command that
        # starts late cannot be stopped (run() then fails on its own deadline and signals it).
        deadline = time.monotonic() + max(timeout, MARKER_TIMEOUT)
        channel = SshChannel(self.label, describe(command),
                             self._open(posix_sh(f"echo {PID_MARKER} {nonce} $$; exec {command}"), timeout), self._kill)
        try:
            channel.pid, channel.login_noise = await_marker(channel, nonce, deadline, self.error)
        except BaseException:
            channel.close()
            raise
        return channel

    def _kill(self, pid: int, signal: str, timeout: float) -> None:
        chan = self._open(posix_sh(kill_script(pid, signal)), timeout, closing=True)
        try:
            chan.shutdown_write()
            chan.status_event.wait(timeout)
        finally:
            chan.close()

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        if not argv:
            raise ValueError("run: empty argv")
        deadline = time.monotonic() + timeout
        channel = self._start(argv, timeout)
        try:
            result = channel.collect(deadline, timeout)
        except BaseException:
            channel.close(grace=0.2)  # it is stuck or unreachable: signal it without waiting long
            raise
        channel.close()
        return result

    def _spawn(self, argv: list[str]) -> Channel:
        return self._start(argv, self.channel_timeout)

    def _disconnect(self) -> None:
        with self._lock:
            if self._clients:
                log.info("%s: SSH connection closed", self.label)
            _close_clients(self._clients)
            self._clients.clear()

    # --- push --------------------------------------------------------------------------------------

    def _default_tmp(self) -> str:
        return "/tmp"

    def _remote_uid(self) -> int:
        if self._uid is None:
            result = self.run(["id", "-u"], self.channel_timeout)
            if result.returncode != 0 or not result.stdout.strip().isdigit():
                raise self.error(f"`id -u` failed (status {result.returncode}): {result.stderr.strip()}")
            self._uid = int(result.stdout)
        return self._uid

    @contextmanager
    def _file_ops(self) -> Iterator[FileOps]:
        uid = self._remote_uid()
        try:
            sftp = self._active().open_sftp_client()
        except NET_ERRORS as exc:
            raise self.error(f"cannot start SFTP (is the sftp subsystem enabled?): {exc}") from None
        channel = sftp.get_channel()
        if channel is not None:
            channel.settimeout(self.channel_timeout)  # a dead connection fails the push, not hangs it
        try:
            yield _SftpOps(sftp, uid)
        except TransportError:
            raise
        except NET_ERRORS as exc:
            raise self.error(f"push failed: {exc}") from None
        finally:
            sftp.close()
