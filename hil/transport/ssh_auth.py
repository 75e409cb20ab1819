"""Who we are and whom we trust on SSH: the config file, host keys, the keys we offer, and why a login failed.

Host keys are checked against ``san_known_hosts`` (else ~/.ssh/known_hosts) and an unknown or changed
key is refused: the lab drives NICs as root, so trusting a key on first use is not an option. Only
public keys are offered (key files, then ssh-agent); passwords are never sent.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import paramiko
from paramiko.auth_strategy import AuthSource, AuthStrategy, InMemoryPrivateKey
from paramiko.hostkeys import InvalidHostKey
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    NoValidConnectionsError,
    PasswordRequiredException,
    SSHException,
)

from hil.inventory import DEFAULT_PORT
from hil.transport.base import TransportError
from hil.transport.known_hosts import load_known_hosts
from hil.transport.ssh_config import DEFAULT_KEYS, Endpoint, Lookup

__all__ = [
    "KNOWN_HOSTS_ERRORS",
    "OfferKeys",
    "UnknownHostKey",
    "explain",
    "keys_to_offer",
    "read_config",
    "strict_client",
]


def read_config(path: Path | None) -> Lookup:
    """The lookup of ``path`` (an ssh config file; None or a missing file: no options for any host).

    OSError, SSHException or ValueError when it cannot be read; ValueError from the lookup for a host
    that needs ProxyCommand, which is not supported.
    """
    config = paramiko.SSHConfig.from_path(path) if path is not None and path.exists() else paramiko.SSHConfig()

    def lookup(alias: str) -> paramiko.SSHConfigDict:
        options = config.lookup(alias)
        if "proxycommand" in options and options["proxycommand"].lower() != "none":
            raise ValueError(f"ProxyCommand (for {alias!r}) is not supported: use ProxyJump")
        return options

    return lookup


class UnknownHostKey(SSHException):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(name)
        self.name = name
        self.key = key


class _RefuseUnknown(paramiko.RejectPolicy):
    """RejectPolicy that keeps the key, so that the message can show its fingerprint."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        raise UnknownHostKey(hostname, key)


KNOWN_HOSTS_ERRORS = (OSError, SSHException, InvalidHostKey, ValueError)  # what strict_client() raises


def strict_client(known_hosts: Path) -> paramiko.SSHClient:
    """A client that accepts only the host keys in ``known_hosts`` (it raises UnknownHostKey for others).

    OSError, SSHException, InvalidHostKey or ValueError when the file cannot be read.
    """
    ssh = paramiko.SSHClient()
    ssh.set_missing_host_key_policy(_RefuseUnknown())
    if known_hosts.exists():  # as OpenSSH reads it: @revoked keys never trusted, bad lines skipped
        load_known_hosts(ssh.get_host_keys(), known_hosts)
    return ssh


class OfferKeys(AuthStrategy):
    """Public keys only, in the given order: passwords are never sent."""

    def __init__(self, user: str, keys: Sequence[paramiko.PKey]) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self._user = user
        self._keys = keys

    def get_sources(self) -> Iterator[AuthSource]:
        for key in self._keys:
            yield InMemoryPrivateKey(self._user, key)


def keys_to_offer(
    ep: Endpoint, fail: Callable[[str], TransportError]
) -> tuple[list[tuple[str, paramiko.PKey]], list[str], paramiko.Agent | None]:
    """(description, key) to offer in order, notes on keys skipped, and the agent to close.

    A key file the inventory named that cannot be used is ``fail(why)``, raised.
    """
    offered: list[tuple[str, paramiko.PKey]] = []
    notes: list[str] = []
    candidates = list(ep.key_files)
    if ep.default_keys:
        candidates += [p for name in DEFAULT_KEYS if (p := Path.home() / ".ssh" / name).is_file()]
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
                raise fail(f"cannot use key file {path}: {problem}") from None
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


def explain(exc: BaseException, ep: Endpoint, offered: list[str], notes: list[str], *, known_hosts: Path,
            connect_timeout: float, banner_timeout: float) -> str:
    """What a failed connect means, in words that say what to do."""
    name = ep.hostname if ep.port == DEFAULT_PORT else f"[{ep.hostname}]:{ep.port}"  # known_hosts form
    if isinstance(exc, UnknownHostKey):
        return (
            f"host key not in {known_hosts}: refusing to connect"
            f" (add it with ssh-keyscan after checking its fingerprint {exc.key.fingerprint})"
        )
    if isinstance(exc, BadHostKeyException):
        return (
            f"HOST KEY MISMATCH, refusing to connect: {ep.at} presented {exc.key.fingerprint} but"
            f" {known_hosts} holds {exc.expected_key.fingerprint} for {name}. Someone may be"
            " intercepting the connection, or the host was reinstalled. Only if you know why it"
            f" changed: ssh-keygen -R '{name}' -f {known_hosts}, then add the new key"
        )
    if isinstance(exc, AuthenticationException):
        skipped = f" ({'; '.join(notes)})" if notes else ""
        if not offered:
            return (
                f"authentication as {ep.user} failed: no key to offer{skipped}; set"
                " ansible_ssh_private_key_file or IdentityFile, or load a key into ssh-agent"
            )
        return f"authentication as {ep.user} failed: the server accepted none of: {', '.join(offered)}{skipped}"
    if isinstance(exc, (NoValidConnectionsError, ConnectionRefusedError)):
        return f"unreachable: connection refused by {ep.at} (is sshd running there? right port?)"
    if isinstance(exc, socket.gaierror):
        return f"unreachable: cannot resolve {ep.hostname!r}: {exc.strerror}"
    if isinstance(exc, TimeoutError):
        return f"unreachable: no answer from {ep.at} within {connect_timeout:g} s"
    if isinstance(exc, OSError):
        return f"unreachable: {ep.at}: {exc.strerror or exc}"
    if isinstance(exc, EOFError):
        return f"{ep.at} closed the connection during the SSH handshake"
    if str(exc) == "No existing session":  # paramiko stopped waiting for the key exchange, then tried to log in
        return (f"SSH handshake with {ep.at} did not finish within {connect_timeout:g} s of its banner"
                " (an overloaded host, or not an SSH server)")
    if "banner" in str(exc).lower():
        return f"no SSH banner from {ep.at} within {banner_timeout:g} s (not sshd, or still booting?)"
    return f"SSH handshake with {ep.at} failed: {exc}"
