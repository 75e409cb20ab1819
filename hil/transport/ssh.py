"""SSH to a lab host with paramiko: ~/.ssh/config, ProxyJump, strict host keys, keys only.

Host keys are checked against ``san_known_hosts`` (else ~/.ssh/known_hosts) and an unknown or changed
key is refused: the lab drives NICs as root, so trusting a key on first use is not an option.
Commands run without a pty, so when the controller or the connection goes away a remote command sees
EOF on stdin (the agent exits on it) instead of being left behind on the host.
"""

from __future__ import annotations

import getpass
import re
import secrets
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import paramiko
from paramiko.auth_strategy import AuthSource, AuthStrategy, InMemoryPrivateKey
from paramiko.hostkeys import InvalidHostKey
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    ChannelException,
    NoValidConnectionsError,
    PasswordRequiredException,
    SSHException,
)

from hil.inventory import DEFAULT_PORT, HostConfig
from hil.transport.base import (
    CLOSE_GRACE,
    Channel,
    CommandResult,
    FileOps,
    Transport,
    TransportError,
    describe,
)

__all__ = ["DEFAULT_KNOWN_HOSTS", "DEFAULT_SSH_CONFIG", "PID_MARKER", "SshChannel", "SshTransport"]

DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
_DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")  # what ssh tries when nothing names a key
_MAX_JUMPS = 8
_NET_ERRORS = (OSError, SSHException, EOFError)  # what a dying connection raises from paramiko calls


PID_MARKER = "pytest-san-agent-pid"  # then a per-spawn nonce and the command's pid: `echo $$` before `exec`
MARKER_TIMEOUT = 10.0  # the least time a command's login gets to print the marker
_MAX_NOISE_LINES = 1000  # what a login shell may print before the marker (motd-like output, .bashrc)
_MAX_NOISE_BYTES = 1 << 20


def _shown(noise: bytes | bytearray) -> str:
    """The login shell's output before the marker, for an error message."""
    return f"; the login shell printed first: {bytes(noise[:300])!r}{'...' if len(noise) > 300 else ''}"


def _hostport(hostname: str, port: int) -> str:
    return f"[{hostname}]:{port}" if ":" in hostname else f"{hostname}:{port}"


# --- one SSH channel running a command -------------------------------------------------------------


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
        except _NET_ERRORS as exc:
            why = self._why_ended() or f"{exc}"
            raise self.error(f"cannot write to `{self.command}`: {why}{self._tail(wait=1.0)}") from None

    def close(self, grace: float = CLOSE_GRACE) -> None:
        if self._closed:
            return
        self._closed = True
        chan = self._chan
        try:
            with suppress(*_NET_ERRORS):
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
        with suppress(*_NET_ERRORS):
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


# --- where to connect: inventory + ~/.ssh/config ---------------------------------------------------


@dataclass(frozen=True)
class _Endpoint:
    alias: str  # as the inventory or the ProxyJump entry names it
    hostname: str
    port: int
    user: str
    key_files: tuple[Path, ...]
    only_key_files: bool  # the inventory named a key: offer nothing else
    default_keys: bool  # nothing named a key: also try ~/.ssh/id_*

    @property
    def at(self) -> str:
        return _hostport(self.hostname, self.port)


def _identity_files(options: paramiko.SSHConfigDict) -> tuple[Path, ...]:
    value: object = options.get("identityfile")  # a list at runtime (the stubs say str)
    names = value if isinstance(value, list) else [value] if isinstance(value, str) else []
    return tuple(Path(str(n)).expanduser() for n in names)


def _config_port(options: paramiko.SSHConfigDict, default: int) -> int:
    value = options.get("port")
    if value is None:
        return default
    if not value.isdigit():
        raise ValueError(f"Port {value!r} is not a number")
    return int(value)


def _split_jump(entry: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` -> (user, host, port)."""
    entry = entry.removeprefix("ssh://")
    user, _, hostport = entry.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif hostport.count(":") == 1:
        host, _, port_text = hostport.partition(":")
    else:
        host, port_text = hostport, ""
    if not host or (port_text and not port_text.isdigit()):
        raise ValueError(f"cannot read ProxyJump entry {entry!r}")
    return user or None, host, int(port_text) if port_text else None


# --- authentication --------------------------------------------------------------------------------


class _OfferKeys(AuthStrategy):
    """Public keys only, in the given order: passwords are never sent."""

    def __init__(self, user: str, keys: Sequence[paramiko.PKey]) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self._user = user
        self._keys = keys

    def get_sources(self) -> Iterator[AuthSource]:
        for key in self._keys:
            yield InMemoryPrivateKey(self._user, key)


class _UnknownHostKey(SSHException):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(name)
        self.name = name
        self.key = key


class _RefuseUnknown(paramiko.RejectPolicy):
    """RejectPolicy that keeps the key, so that the message can show its fingerprint."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        raise _UnknownHostKey(hostname, key)


# --- file operations for push ----------------------------------------------------------------------


class _SftpOps:
    def __init__(self, sftp: paramiko.SFTPClient, uid: int) -> None:
        self._sftp = sftp
        self.uid = uid

    def stat(self, path: str) -> tuple[int, int] | None:
        try:
            st = self._sftp.lstat(path)
        except FileNotFoundError:
            return None
        return (-1 if st.st_uid is None else st.st_uid), st.st_mode or 0

    def mkdir(self, path: str) -> None:
        self._sftp.mkdir(path, 0o700)

    def write(self, path: str, data: bytes) -> None:
        with self._sftp.open(path, "wb") as f:
            f.set_pipelined(True)  # one round trip per file rather than per 32 KiB
            f.write(data)

    def rename(self, src: str, dst: str) -> bool:
        try:
            self._sftp.rename(src, dst)  # OpenSSH's sftp-server refuses to replace an existing directory
        except OSError:
            if self.stat(dst) is not None:
                return False
            raise
        return True

    def remove_tree(self, path: str) -> None:
        try:
            for entry in self._sftp.listdir_attr(path):
                child = f"{path}/{entry.filename}"
                if stat.S_ISDIR(entry.st_mode or 0):
                    self.remove_tree(child)
                else:
                    self._sftp.remove(child)
            self._sftp.rmdir(path)
        except _NET_ERRORS:
            pass


# --- the transport ---------------------------------------------------------------------------------


class SshTransport(Transport):
    """A lab host over SSH. Timeouts in seconds; ``ssh_config=None`` ignores ~/.ssh/config."""

    def __init__(
        self,
        host: HostConfig,
        *,
        connect_timeout: float = 10.0,
        banner_timeout: float = 30.0,
        auth_timeout: float = 30.0,
        channel_timeout: float = 30.0,
        keepalive: float = 15.0,
        ssh_config: Path | None = DEFAULT_SSH_CONFIG,
    ) -> None:
        super().__init__(host, f"{host.name} ({_hostport(host.host, host.port)})")
        self.connect_timeout = connect_timeout
        self.banner_timeout = banner_timeout
        self.auth_timeout = auth_timeout
        self.channel_timeout = channel_timeout
        self.keepalive = keepalive
        self.known_hosts = (host.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
        self._config_path = ssh_config.expanduser() if ssh_config else None
        self._config = self._load_config()
        try:
            self._target, jump = self._resolve_target()
            self._hops = self._jump_chain(jump, depth=0)
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

    # --- configuration -----------------------------------------------------------------------------

    def _load_config(self) -> paramiko.SSHConfig:
        path = self._config_path
        if path is None or not path.exists():
            return paramiko.SSHConfig()
        try:
            return paramiko.SSHConfig.from_path(path)
        except (OSError, SSHException, ValueError) as exc:
            raise self.error(f"cannot read {path}: {exc}") from None

    def _lookup(self, alias: str) -> paramiko.SSHConfigDict:
        options = self._config.lookup(alias)
        if "proxycommand" in options and options["proxycommand"].lower() != "none":
            raise ValueError(f"ProxyCommand (for {alias!r}) is not supported: use ProxyJump")
        return options

    def _resolve_target(self) -> tuple[_Endpoint, str | None]:
        host = self.host
        options = self._lookup(host.host)
        # Inventory values win; its port default (22) is indistinguishable from "not set", so
        # a config Port applies then.
        port = host.port if host.port != DEFAULT_PORT else _config_port(options, DEFAULT_PORT)
        user = host.user or options.get("user") or getpass.getuser()
        keys: tuple[Path, ...]
        if host.key_file is not None:
            keys, only, defaults = (host.key_file,), True, False
        else:
            keys = _identity_files(options)
            only, defaults = False, not keys
        target = _Endpoint(host.host, options.get("hostname", host.host), port, user, keys, only, defaults)
        return target, options.get("proxyjump")

    def _jump_chain(self, spec: str | None, depth: int) -> list[_Endpoint]:
        if not spec or spec.lower() == "none":
            return []
        if depth >= _MAX_JUMPS:
            raise ValueError(f"ProxyJump nests more than {_MAX_JUMPS} deep: is there a loop?")
        hops: list[_Endpoint] = []
        for i, entry in enumerate(e.strip() for e in spec.split(",")):
            user, alias, port = _split_jump(entry)
            options = self._lookup(alias)
            if i == 0:  # as with ssh, the first hop's own ProxyJump applies (ssh -J overrides the rest)
                hops += self._jump_chain(options.get("proxyjump"), depth + 1)
            keys = _identity_files(options)
            # Without an IdentityFile of its own, a lab's jump host usually takes the lab key.
            fallback = (self.host.key_file,) if self.host.key_file is not None else ()
            hops.append(
                _Endpoint(
                    alias=alias,
                    hostname=options.get("hostname", alias),
                    port=port or _config_port(options, DEFAULT_PORT),
                    user=user or options.get("user") or getpass.getuser(),
                    key_files=keys or fallback,
                    only_key_files=False,
                    default_keys=not keys,
                )
            )
        return hops

    # --- connecting --------------------------------------------------------------------------------

    def connect(self) -> None:
        self._check_open()
        with self._lock:
            if self._clients:
                transport = self._clients[-1].get_transport()
                if transport is not None and transport.is_active():
                    return
                for client in reversed(self._clients):  # lost (host rebooted?): connect afresh
                    client.close()
                self._clients = []
            clients: list[paramiko.SSHClient] = []
            try:
                previous: _Endpoint | None = None
                for ep in (*self._hops, self._target):
                    sock = self._tunnel(clients[-1], previous, ep) if previous else None
                    clients.append(self._connect_one(ep, sock, self._prefix(ep)))
                    previous = ep
            except BaseException:
                for client in reversed(clients):
                    client.close()
                raise
            self._clients = clients

    def _prefix(self, ep: _Endpoint) -> str:
        return "" if ep is self._target else f"jump host {ep.alias} ({ep.at}): "

    def _tunnel(self, client: paramiko.SSHClient, via: _Endpoint, ep: _Endpoint) -> paramiko.Channel:
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
        except _NET_ERRORS as exc:
            raise self.error(f"{self._prefix(via)}connection lost while opening a tunnel to {ep.at}: {exc}") from None

    def _connect_one(self, ep: _Endpoint, sock: paramiko.Channel | None, prefix: str) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_RefuseUnknown())
        if self.known_hosts.exists():
            try:
                client.load_system_host_keys(str(self.known_hosts))
            except (OSError, SSHException, InvalidHostKey, ValueError) as exc:
                raise self.error(f"cannot read known hosts {self.known_hosts}: {exc}") from None
        offered, notes, agent = self._keys(ep, prefix)
        try:
            client.connect(
                ep.hostname,
                ep.port,
                timeout=self.connect_timeout,
                sock=sock,
                banner_timeout=self.banner_timeout,
                auth_timeout=self.auth_timeout,
                channel_timeout=self.channel_timeout,
                auth_strategy=_OfferKeys(ep.user, [key for _, key in offered]),
            )
        except (*_NET_ERRORS, _UnknownHostKey) as exc:
            client.close()
            raise self.error(prefix + self._explain(exc, ep, [d for d, _ in offered], notes)) from None
        except BaseException:
            client.close()
            raise
        finally:
            if agent is not None:
                agent.close()
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, round(self.keepalive)))  # keeps NAT/firewall state alive
        return client

    def _keys(
        self, ep: _Endpoint, prefix: str
    ) -> tuple[list[tuple[str, paramiko.PKey]], list[str], paramiko.Agent | None]:
        """(description, key) to offer in order, notes on keys skipped, and the agent to close."""
        offered: list[tuple[str, paramiko.PKey]] = []
        notes: list[str] = []
        candidates = list(ep.key_files)
        if ep.default_keys:
            candidates += [p for name in _DEFAULT_KEYS if (p := Path.home() / ".ssh" / name).is_file()]
        for path in candidates:
            try:
                key = paramiko.PKey.from_path(path)
            except Exception as exc:  # paramiko raises many kinds for unreadable or unknown key files
                problem = (
                    "it is encrypted (load it into ssh-agent)"
                    if isinstance(exc, PasswordRequiredException)
                    else (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
                )
                if ep.only_key_files:
                    raise self.error(f"{prefix}cannot use key file {path}: {problem}") from None
                notes.append(f"skipped {path}: {problem}")
                continue
            offered.append((f"{path} ({key.algorithm_name} {key.fingerprint})", key))
        agent: paramiko.Agent | None = None
        if not ep.only_key_files:
            try:
                agent = paramiko.Agent()
                offered += [(f"ssh-agent key {k.fingerprint} {k.comment}".strip(), k) for k in agent.get_keys()]
            except SSHException as exc:
                notes.append(f"ssh-agent unusable: {exc}")
        return offered, notes, agent

    def _explain(self, exc: BaseException, ep: _Endpoint, offered: list[str], notes: list[str]) -> str:
        """What a failed connect means, in words that say what to do."""
        name = ep.hostname if ep.port == DEFAULT_PORT else f"[{ep.hostname}]:{ep.port}"  # known_hosts form
        if isinstance(exc, _UnknownHostKey):
            return (
                f"host key not in {self.known_hosts}: refusing to connect"
                f" (add it with ssh-keyscan after checking its fingerprint {exc.key.fingerprint})"
            )
        if isinstance(exc, BadHostKeyException):
            return (
                f"HOST KEY MISMATCH, refusing to connect: {ep.at} presented {exc.key.fingerprint} but"
                f" {self.known_hosts} holds {exc.expected_key.fingerprint} for {name}. Someone may be"
                " intercepting the connection, or the host was reinstalled. Only if you know why it"
                f" changed: ssh-keygen -R '{name}' -f {self.known_hosts}, then add the new key"
            )
        if isinstance(exc, AuthenticationException):
            skipped = f" ({'; '.join(notes)})" if notes else ""
            if not offered:
                return (
                    f"authentication as {ep.user} failed: no key to offer{skipped}; set"
                    " ansible_ssh_private_key_file or IdentityFile, or load a key into ssh-agent"
                )
            return f"authentication as {ep.user} failed: the server accepted none of: {', '.join(offered)}{skipped}"
        if isinstance(exc, NoValidConnectionsError):
            return f"unreachable: connection refused by {ep.at} (is sshd running there? right port?)"
        if isinstance(exc, socket.gaierror):
            return f"unreachable: cannot resolve {ep.hostname!r}: {exc.strerror}"
        if isinstance(exc, TimeoutError):
            return f"unreachable: no answer from {ep.at} within {self.connect_timeout:g} s"
        if isinstance(exc, OSError):
            return f"unreachable: {ep.at}: {exc.strerror or exc}"
        if isinstance(exc, EOFError):
            return f"{ep.at} closed the connection during the SSH handshake"
        if "banner" in str(exc).lower():
            return f"no SSH banner from {ep.at} within {self.banner_timeout:g} s (not sshd, or still booting?)"
        return f"SSH handshake with {ep.at} failed: {exc}"

    # --- commands ----------------------------------------------------------------------------------

    def _active(self) -> paramiko.Transport:
        self._check_open()
        transport = self.paramiko_transport
        if transport is None:
            raise self.error("not connected: call connect() first")
        if not transport.is_active():
            reason = transport.get_exception()
            raise self.error("the SSH connection was lost" + (f" ({reason})" if reason else ""))
        return transport

    def _open(self, command: str, timeout: float | None = None) -> paramiko.Channel:
        transport = self._active()
        # A frozen or vanished host never answers the open: wait no longer than the caller allows.
        wait = self.channel_timeout if timeout is None else min(timeout, self.channel_timeout)
        try:
            chan = transport.open_session(timeout=wait)
        except _NET_ERRORS as exc:
            raise self.error(f"cannot open a session for `{describe(command)}`: {exc}") from None
        try:
            chan.exec_command(command)
        except _NET_ERRORS as exc:
            chan.close()
            raise self.error(f"the server refused to run `{describe(command)}`: {exc}") from None
        return chan

    def _start(self, argv: Sequence[str], timeout: float) -> SshChannel:
        """Run ``argv`` behind ``echo <marker> $$; exec``: the marker line gives its pid, to signal it.

        A login shell may print anything first (``.bashrc``, a ``command=`` in authorized_keys, a
        banner): those lines are skipped, and only a line ending in the marker with this spawn's random
        nonce is believed. A number printed by the shell must never be taken for the pid: ``close()``
        signals that process group (with 1, a root ``kill -TERM -- -1`` would hit the whole host).
        """
        command = shlex.join(argv)
        nonce = secrets.token_hex(8)
        # However short the caller's timeout, the pid is worth waiting for: without it a command that
        # starts late cannot be stopped (run() then fails on its own deadline and signals it).
        deadline = time.monotonic() + max(timeout, MARKER_TIMEOUT)
        channel = SshChannel(self.label, describe(command),
                             self._open(f"echo {PID_MARKER} {nonce} $$; exec {command}", timeout), self._kill)
        try:
            channel.pid, channel.login_noise = self._await_marker(channel, nonce, deadline)
        except BaseException:
            channel.close()
            raise
        return channel

    def _await_marker(self, channel: SshChannel, nonce: str, deadline: float) -> tuple[int, bytes]:
        """(pid, what the login shell printed before it) from the first line ending in the marker."""
        pattern = re.compile(rb"%s %s (\d+)\r?\n\Z" % (PID_MARKER.encode(), nonce.encode()))
        noise = bytearray()
        lines = 0
        while True:
            try:
                line = channel.readline(max(0.0, deadline - time.monotonic()))
            except TransportError as exc:
                if not noise:
                    raise
                raise self.error(f"{exc.reason}{_shown(noise)}") from None
            found = pattern.search(line)
            if found is not None:
                break
            noise += line
            lines += 1
            if lines > _MAX_NOISE_LINES or len(noise) > _MAX_NOISE_BYTES:
                raise self.error(f"`{channel.command}` did not start: the login shell printed more than"
                                 f" {_MAX_NOISE_LINES} lines or {_MAX_NOISE_BYTES} bytes before the"
                                 f" process id marker{_shown(noise)}")
        pid = int(found.group(1))
        if pid <= 1:  # a shell's own $$ is never 0 or 1
            raise self.error(f"`{channel.command}` reported process id {pid}: refusing to signal it")
        return pid, bytes(noise)

    def _kill(self, pid: int, signal: str, timeout: float) -> None:
        # The command leads its own process group (sshd runs it in a new session): signal the group.
        chan = self._open(f"kill -{signal} -- -{pid} 2>/dev/null || kill -{signal} {pid}", timeout)
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
            for client in reversed(self._clients):  # the target, then the hops it tunnels through
                client.close()
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
        except _NET_ERRORS as exc:
            raise self.error(f"cannot start SFTP (is the sftp subsystem enabled?): {exc}") from None
        channel = sftp.get_channel()
        if channel is not None:
            channel.settimeout(self.channel_timeout)  # a dead connection fails the push, not hangs it
        try:
            yield _SftpOps(sftp, uid)
        except TransportError:
            raise
        except _NET_ERRORS as exc:
            raise self.error(f"push failed: {exc}") from None
        finally:
            sftp.close()
