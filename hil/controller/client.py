"""Starting an agent on a host and calling it: the controller's side of the protocol."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hil.agent.server import agent_files
from hil.controller.errors import AgentError, AgentStartError, HostBusy, failure, start_failure
from hil.controller.leases import describe_holder
from hil.inventory import HostConfig
from hil.rpc import framing as wire
from hil.rpc.errors import rebuild
from hil.transport import Channel, Transport, TransportError

if TYPE_CHECKING:
    from hil.rpc.codec import Encoded

__all__ = ["AgentClient", "AgentError", "AgentStartError", "HostBusy", "Outcome", "agent_bundle", "push_agent"]

ROOT = Path(__file__).resolve().parents[2]  # where hil/ and pytest_san/ sit side by side


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


log = logging.getLogger(__name__)  # agents starting, saying hello, stopping, dying

Outcome = tuple[bool, Any]
"""(True, a reply's result: decoded JSON, arbitrary) or (False, the exception its error stands for)."""

# Seconds an agent may take to say hello: it imports pyverbs and starts its default process's child, about
# 20 s in a quiet TCG guest and over 60 s while CI loads both cores (every lab test then failed at 60 s). An
# agent that cannot start says why at once; this bounds only silence.
START_TIMEOUT = 180.0
MAX_NOISE_LINES = 1000  # output before the hello that is skipped (a login or interpreter printing)
MAX_NOISE_BYTES = 1 << 20


class AgentClient:
    """One agent process on one host; ``call`` sends a request and waits for its reply."""

    def __init__(self, host: HostConfig, transport: Transport, *, call_timeout: float = 120.0,
                 start_timeout: float = START_TIMEOUT, lease: Mapping[str, object] | None = None) -> None:
        self.host = host
        self.transport = transport
        self.call_timeout = call_timeout
        self._ids = itertools.count(1)
        self._unread: list[tuple[int, str]] = []  # (request id, method) written, reply not yet read
        self.round_trips = 0
        """Times the controller waited for this agent's replies (pipelined requests answered together count
        once): machine-independent, unlike the time they took."""
        directory, self.content_hash = push_agent(transport)
        argv = [*host.python_argv, f"{directory}/hil/agent/__main__.py", "--engine", host.engine,
                "--host", host.name, "--hash", self.content_hash,
                "--options", json.dumps(self._engine_options())]
        if lease is not None:
            argv += ["--lease", json.dumps(dict(lease), sort_keys=True)]
        self.command = shlex.join(argv)
        log.debug("%s: starting the agent: %s", self.where, self.command)
        self.channel: Channel = transport.spawn(argv)
        self.dead: str | None = None
        self.last_reply = time.time()  # when the agent was last heard from (wall clock)
        self.noise: list[bytes] = []  # lines before the hello that were not one (a chatty login, sitecustomize)
        try:
            self.hello: dict[str, Any] = self._hello(start_timeout)
        except BaseException:
            self.channel.close()
            raise
        if "failed" in self.hello:  # the engine could not start: the agent said why and exits
            self.channel.close()
            self.dead = "could not start"
            failed = self.hello["failed"] if isinstance(self.hello["failed"], dict) else {}
            error = start_failure(self.where, failed, self.channel.stderr_text(wait=1.0), host.name)
            log.warning("%s", str(error).partition("\n")[0])
            raise error
        if "busy" in self.hello:
            self.channel.close()
            holder = self.hello["busy"] if isinstance(self.hello["busy"], dict) else {}
            log.info("%s: leased by %s", self.where, describe_holder(holder))
            raise HostBusy(host.name, holder, f"{self.where}: leased by {describe_holder(holder)}")
        if self.hello.get("protocol") != wire.PROTOCOL_VERSION or self.hello.get("hash") != self.content_hash:
            self.channel.close()
            raise AgentError(f"{self.where}: agent speaks protocol {self.hello.get('protocol')} with hash "
                             f"{self.hello.get('hash')}, this controller {wire.PROTOCOL_VERSION} / {self.content_hash}")
        log.info("%s: agent started (pid %s)", self.where, self.hello.get("pid"))
        log.debug("%s: hello: capabilities %s, nodes %s", self.where, self.hello.get("capabilities"),
                  [n.get("name") for n in self.hello.get("nodes", []) if isinstance(n, dict)])

    @property
    def where(self) -> str:
        return f"host {self.host.name} ({self.host.host}:{self.host.port}, engine {self.host.engine})"

    def _engine_options(self) -> dict[str, str | int | None]:
        options: dict[str, str | int | None] = {}
        if self.host.engine == "verbs":
            options = {"device": self.host.device, "gid_index": self.host.gid_index,
                       "netdev": self.host.netdev}
            if self.host.device_port is not None:  # only when set: an older agent knows no port
                options["port"] = self.host.device_port
        return options

    def _line(self, timeout: float, what: str) -> bytes:
        try:
            line = self.channel.readline(timeout)
        except TransportError as exc:
            self._died(str(exc))
            # An agent that exited: its last stderr line on the message's first line, all a short summary shows.
            last = "" if self.channel.alive else self.channel.stderr_text().strip().rpartition("\n")[2].strip()
            said = f" (its last words on stderr: {last[:300]})" if last else ""
            raise AgentError(f"{self.where}: agent gone while waiting for {what}{said}: {exc}{self._noise()}") from None
        self.last_reply = time.time()
        return line

    def _hello(self, timeout: float) -> dict[str, Any]:
        """The agent's hello; lines before it that are not one are skipped (nothing was asked yet)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._line(max(0.0, deadline - time.monotonic()), "the agent's hello")
            try:
                message = wire.decode(line)
            except Exception:  # not JSON, bad base64, nested too deep: noise either way
                message = None
            hello = None if message is None else message.get("hello")
            if isinstance(hello, dict):
                return hello
            self.noise.append(line)
            if len(self.noise) > MAX_NOISE_LINES or sum(map(len, self.noise)) > MAX_NOISE_BYTES:
                self.dead = "no hello"
                raise AgentError(f"{self.where}: no hello from the agent within {MAX_NOISE_LINES} lines or "
                                 f"{MAX_NOISE_BYTES} bytes of output{self._noise()}")

    def _noise(self) -> str:
        if not self.noise:
            return ""
        text = b"".join(self.noise)
        return f"; before its hello it printed {text[:300]!r}{'...' if len(text) > 300 else ''}"

    def _died(self, why: str) -> None:
        if self.dead is None:
            log.warning("%s: agent gone: %s", self.where, why.partition("\n")[0])
        self.dead = why

    def _out_of_step(self, problem: str) -> AgentError:
        """The agent's output can no longer be trusted: it is dead (HilBackend.reset replaces it)."""
        self._died(problem)
        self.channel.close()  # it exits, releasing what it held: nothing it says can be matched to a call
        return AgentError(f"{self.where}: {problem}; the agent was stopped (a fresh one serves the next test)")

    def _reply(self, rid: int, timeout: float, what: str) -> dict[str, Any]:
        line = self._line(timeout, what)
        shown = f"{line[:200]!r}{'...' if len(line) > 200 else ''}"
        try:
            reply = wire.decode(line)
        except Exception as exc:  # whatever is wrong with the line, the stream is
            raise self._out_of_step(f"waiting for {what}, the agent sent a line that is not a reply "
                                    f"({type(exc).__name__}: {exc}): {shown}") from None
        if reply.get("id") != rid or ("result" in reply) == ("error" in reply) or (
                "error" in reply and not isinstance(reply["error"], dict)):
            raise self._out_of_step(f"waiting for {what}, the agent sent {shown}: protocol out of step")
        return reply

    def send(self, obj: Encoded, method: str, args: Sequence[Encoded]) -> int:
        """Write one request without waiting for its reply: its request id (``collect`` reads the reply). ``obj``:
        the object's id, or (in a batch) a reference to an earlier request's result."""
        if self.dead:
            raise AgentError(f"{self.where}: agent is gone ({self.dead})")
        rid = next(self._ids)
        data = wire.encode({"id": rid, "obj": obj, "method": method, "args": list(args)})
        try:
            self.channel.write(data)
        except TransportError as exc:
            self._died(str(exc))
            raise AgentError(f"{self.where}: cannot reach the agent: {exc}") from None
        self._unread.append((rid, method))
        return rid

    def collect(self, timeout: float | None = None) -> list[Outcome]:
        """The replies to every request sent and not yet read, in order: one round trip, however many
        requests were pipelined. Each outcome is (True, result) or (False, the exception its error stands
        for); an agent that fails to answer raises AgentError (it is dead then)."""
        pending, self._unread = self._unread, []
        if not pending:
            return []
        self.round_trips += 1
        out: list[Outcome] = []
        for rid, method in pending:
            reply = self._reply(rid, timeout or self.call_timeout, f"{method} (request {rid})")
            out.append((False, _error(reply["error"], self.where)) if "error" in reply else (True, reply["result"]))
        return out

    def call_many(self, requests: Sequence[tuple[int, str, Sequence[Encoded]]],
                  timeout: float | None = None) -> list[Outcome]:
        """Pipelined requests (obj, method, encoded args): all written, then all replies read (one round
        trip). The agent answers them in order, each as if called alone."""
        for obj, method, args in requests:
            self.send(obj, method, args)
        return self.collect(timeout)

    def call(self, obj: int, method: str, *args: Encoded, timeout: float | None = None) -> Any:
        """``method`` of the agent's object ``obj`` with encoded arguments (``hil.rpc.codec``): its result,
        as the agent sent it (JSON, bytes as bytes: arbitrary), or the exception its error stands for."""
        ok, value = self.call_many([(obj, method, args)], timeout)[-1]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Closing the agent's stdin makes it release everything and exit."""
        was_running = not self.channel.closed
        self.channel.close()
        if was_running:
            log.info("%s: agent stopped (pid %s)", self.where, getattr(self, "hello", {}).get("pid"))


def _error(error: Mapping[str, object], where: str) -> Exception:
    """An agent's error object as the exception it stands for; an agent failing is an AgentError naming
    ``where`` (the host), with the agent's traceback."""
    return rebuild(error, lambda kind, message, trace: failure(where, kind, message, trace))
