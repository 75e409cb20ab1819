"""Starting an agent on a host and calling it: the controller's side of the protocol."""

from __future__ import annotations

import functools
import itertools
import json
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_san.errors import SanError, WsaError

from .agent import wire
from .agent.server import agent_files
from .inventory import HostConfig
from .transport import Channel, Transport, TransportError

ROOT = Path(__file__).resolve().parents[1]  # where hil/ and pytest_san/ sit side by side


@functools.cache
def agent_bundle() -> tuple[dict[str, bytes], str]:
    """The agent's files and their content hash, read once per controller process (every agent of a run
    is the same code, however often hosts are retried or agents restarted)."""
    files = dict(agent_files(ROOT))
    return files, wire.tree_hash(files.items())


def push_agent(transport: Transport) -> tuple[str, str]:
    """Push the agent to ``transport``'s host: (its directory there, its content hash)."""
    files, content_hash = agent_bundle()
    return transport.push(files, name="pytest-san-agent"), content_hash


class AgentError(RuntimeError):
    """The agent failed in a way that is not a SAN error: the message names the host."""


class HostBusy(AgentError):
    """The host is leased by another agent (another worker, run or controller); ``holder`` says whose."""

    def __init__(self, host: str, holder: Mapping[str, Any], message: str) -> None:
        super().__init__(message)
        self.host = host
        self.holder = dict(holder)

    def __reduce__(self) -> tuple[type[HostBusy], tuple[str, dict[str, Any], str]]:
        return type(self), (self.host, self.holder, str(self))


class AgentClient:
    """One agent process on one host; ``call`` sends a request and waits for its reply."""

    def __init__(self, host: HostConfig, transport: Transport, *, call_timeout: float = 120.0,
                 start_timeout: float = 60.0, lease: Mapping[str, Any] | None = None) -> None:
        self.host = host
        self.transport = transport
        self.call_timeout = call_timeout
        self._ids = itertools.count(1)
        directory, self.content_hash = push_agent(transport)
        argv = [host.python_interpreter, f"{directory}/hil/agent/__main__.py", "--engine", host.engine,
                "--host", host.name, "--hash", self.content_hash,
                "--options", json.dumps(self._engine_options())]
        if lease is not None:
            argv += ["--lease", json.dumps(dict(lease), sort_keys=True)]
        self.command = shlex.join(argv)
        self.channel: Channel = transport.spawn(argv)
        self.dead: str | None = None
        self.last_reply = time.time()  # when the agent was last heard from (wall clock)
        hello = self._read(start_timeout, "the agent's hello")
        if "hello" not in hello:
            raise AgentError(f"{self.where}: expected a hello from the agent, got {hello!r:.200}")
        self.hello: dict[str, Any] = hello["hello"]
        if "busy" in self.hello:
            self.channel.close()
            from .leases import describe_holder

            holder = self.hello["busy"] if isinstance(self.hello["busy"], dict) else {}
            raise HostBusy(host.name, holder, f"{self.where}: leased by {describe_holder(holder)}")
        if self.hello.get("protocol") != wire.PROTOCOL_VERSION or self.hello.get("hash") != self.content_hash:
            raise AgentError(f"{self.where}: agent speaks protocol {self.hello.get('protocol')} with hash "
                             f"{self.hello.get('hash')}, this controller {wire.PROTOCOL_VERSION} / {self.content_hash}")

    @property
    def where(self) -> str:
        return f"host {self.host.name} ({self.host.host}:{self.host.port}, engine {self.host.engine})"

    def _engine_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.host.engine == "verbs":
            options = {"device": self.host.device, "gid_index": self.host.gid_index,
                       "netdev": self.host.netdev}
        return options

    def _read(self, timeout: float, what: str) -> dict[str, Any]:
        try:
            line = self.channel.readline(timeout)
        except TransportError as exc:
            self.dead = str(exc)
            raise AgentError(f"{self.where}: agent gone while waiting for {what}: {exc}") from None
        self.last_reply = time.time()
        return wire.decode(line)

    def call(self, obj: int, method: str, *args: Any, timeout: float | None = None) -> Any:
        if self.dead:
            raise AgentError(f"{self.where}: agent is gone ({self.dead})")
        rid = next(self._ids)
        try:
            self.channel.write(wire.encode({"id": rid, "obj": obj, "method": method, "args": list(args)}))
        except TransportError as exc:
            self.dead = str(exc)
            raise AgentError(f"{self.where}: cannot reach the agent: {exc}") from None
        reply = self._read(timeout or self.call_timeout, f"{method} (request {rid})")
        if reply.get("id") != rid:
            raise AgentError(f"{self.where}: reply {reply.get('id')} to request {rid}: protocol out of step")
        if "error" in reply:
            raise _error(reply["error"], self.where)
        return reply["result"]

    def close(self) -> None:
        """Closing the agent's stdin makes it release everything and exit."""
        self.channel.close()


def _error(error: dict[str, Any], where: str) -> Exception:
    kind, message = error.get("kind"), error.get("message", "")
    if kind == "SanError":
        exc = SanError(WsaError(error["code"]), required_size=error.get("required_size"))
        exc.args = (message,)
        return exc
    if kind == "TimeoutError":
        return TimeoutError(message)
    if kind == "ValueError":
        return ValueError(message)
    detail = f"\n{error['traceback']}" if error.get("traceback") else ""
    return AgentError(f"{where}: {kind}: {message}{detail}")
