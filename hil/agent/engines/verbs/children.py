"""The agent's side of the verbs engine's child processes: one modelled process = one child OS process.

``ChildProcess`` starts ``child.py`` (its own verbs Context/PD/CQ) and is a small JSON-lines client
for it; ``kill()`` ends it (its registrations vanish with it). ``raise_error`` turns a child's error
object back into the exception it stands for (``SanError``, ``TimeoutError``, ..., else
``ChildFailure``); ``ChildGone`` is a child that exited while a reply was awaited.

Standard library only; Python 3.9+.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any, NoReturn

from hil.agent.engines.verbs.devices import NoRdmaDevice
from hil.rpc.codec import to_json
from hil.rpc.errors import rebuild
from hil.rpc.framing import decode, encode

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")


def carried(value: object) -> object:
    """``value`` as a request to a child can carry it: an object JSON cannot (an argument the controller could
    not send as itself reaches the engine as an ``Opaque``) goes as ``{"$x": repr}``, which the child refuses
    as it would refuse the object (a memoryview descriptor, say, rather than the agent's own TypeError that
    encoding it would raise)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, bytearray)):
        return value
    if isinstance(value, (list, tuple)):
        return [carried(v) for v in value]
    if isinstance(value, dict):
        return {k: carried(v) for k, v in value.items()}
    return {"$x": repr(value)}

def _key(method: str, params: Mapping[str, object]) -> str:
    return json.dumps(to_json({"method": method, "params": carried(dict(params))}), sort_keys=True)


class ChildGone(ConnectionError):
    """The child process exited (or was killed) while a reply was awaited."""


class ChildFailure(RuntimeError):
    """A request failed in the child for a reason that is not a Winsock error."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"{kind}: {message}")


def raise_error(error: Mapping[str, object]) -> NoReturn:
    """Raise the exception a child's error object stands for (``hil.rpc.errors``): a SanError, a
    TimeoutError, ValueError or TypeError as itself, anything else as a ChildFailure."""
    raise rebuild(error, lambda kind, message, _trace: ChildFailure(kind, message))


class ChildProcess:
    """One modelled process: a child running ``child.py`` with its own verbs Context, and its client.

    ``hello`` holds what the child reported once its device was open (pid, device, gid, ...).
    Calls are serialised (one request at a time); ``call`` raises SanError for Winsock errors,
    TimeoutError for an operation wait that timed out, ChildGone when the child died.
    """

    _ids = itertools.count(1)

    def __init__(self, device: str, port: int = 1, address: str | None = None, python: str | None = None,
                 mw_mode: str = "auto", start_timeout: float = 120.0, env: dict[str, str] | None = None,
                 *, wait: bool = True) -> None:
        """Start the child; ``wait``: also wait for its hello (else ``ready()`` does, e.g. for a spare)."""
        self.python = python or sys.executable
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the child
        cmd = [self.python, CHILD, "--device", device, "--port", str(port), "--mw-mode", mw_mode]
        if address:
            cmd += ["--address", address]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      env=env, close_fds=True)
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_loop, name=f"san-child-{self._proc.pid}", daemon=True)
        self._reader.start()
        self._lock = threading.Lock()
        # Read-only requests written ahead (``prefetch``): (method, params) -> request id; their replies as
        # they arrive, until a request for the same (method, params) takes one.
        self._ahead: dict[str, int] = {}
        self._early: dict[int, dict[str, Any]] = {}
        self.pid = self._proc.pid  # the OS pid (the child reports the same in hello)
        self._start_timeout = start_timeout
        self.hello: dict[str, Any] = {}
        if wait:
            self.ready()

    def ready(self) -> ChildProcess:
        """Wait for the child's hello (once): its device open, or the reason it could not start."""
        if self.hello:
            return self
        try:
            reply = self._next_line(self._start_timeout)
        except BaseException:
            self.kill()
            raise
        if "error" in reply:
            self.kill()
            error = reply["error"]
            text = error.get("message") or ""
            if "no RDMA device" in text or "get_device_list" in text:
                raise NoRdmaDevice(text)
            if error.get("kind") == "ImportError":
                raise NoRdmaDevice(text)
            raise_error(error)
        self.hello = reply["result"]
        return self

    def _read_loop(self) -> None:
        stdout = self._proc.stdout
        assert stdout is not None
        for line in stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next_line(self, timeout: float | None) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"child {self._proc.pid} sent no reply within {timeout} s") from None
        if line is None:
            self._lines.put(None)
            self._proc.wait()
            raise ChildGone(f"child {self._proc.pid} exited (code {self._proc.returncode}): "
                            f"{self.stderr_tail()}")
        return decode(line)

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")[-limit:].strip()
        except (OSError, ValueError):
            return ""

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    reply_timeout = 120.0  # seconds a request may take (TCG guests are slow)

    def call(self, method: str, **params: object) -> Any:
        """One request with keyword parameters; waits ``reply_timeout`` seconds for the reply (the
        child's result: decoded JSON, arbitrary until the caller reads it)."""
        return self.request(method, params, self.reply_timeout)

    def request(self, method: str, params: Mapping[str, object], reply_timeout: float | None) -> Any:
        """One request; ``reply_timeout`` bounds the wait for the reply (None: forever). A read-only request
        written ahead (``prefetch``) with the same method and parameters is not written again: its reply is it."""
        with self._lock:
            rid = self._ahead.pop(_key(method, params), None)
            if rid is None:
                rid = self._write(method, params)
            reply = self._early.pop(rid, None)
            while reply is None:
                line = self._next_line(reply_timeout)
                if line.get("id") == rid:
                    reply = line
                elif line.get("id") in self._ahead.values():
                    self._early[line["id"]] = line  # a request written ahead: kept for its taker
        if "error" in reply:
            raise_error(reply["error"])
        return reply.get("result")

    def _write(self, method: str, params: Mapping[str, object]) -> int:
        if not self.alive:
            raise ChildGone(f"child {self._proc.pid} is gone (code {self._proc.returncode})")
        rid = next(self._ids)
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(encode({"id": rid, "method": method, "params": carried(params)}))
            stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChildGone(f"child {self._proc.pid} is gone: {self.stderr_tail()}") from None
        return rid

    def prefetch(self, method: str, params: Mapping[str, object]) -> None:
        """Write a read-only request now, its reply taken by the next ``request`` of the same method and
        parameters: requests that arrive together reach the child together, and it answers them back to back.
        Only for requests that change nothing, and only until ``forget_prefetched`` (before anything that does)."""
        key = _key(method, params)
        with self._lock:
            if key not in self._ahead and self.alive:
                with contextlib.suppress(ChildGone):
                    self._ahead[key] = self._write(method, params)

    def forget_prefetched(self) -> None:
        """Requests written ahead that nobody took: their replies, when they come, are dropped (a later request
        must see what the requests before it changed)."""
        with self._lock:
            self._ahead.clear()
            self._early.clear()

    # Convenience wrappers (the names of the provider calls).
    def alloc(self, nbytes: int) -> tuple[int, int]:
        r = self.call("alloc", nbytes=nbytes)
        return r["address"], r["length"]

    def read(self, address: int, length: int) -> bytes:
        data: bytes = self.call("read", address=address, length=length)
        return data

    def write(self, address: int, data: bytes) -> None:
        self.call("write", address=address, data=bytes(data))

    def socket_listen(self) -> tuple[int, dict[str, Any]]:
        """A listening socket and where its peer connects: (socket, {"address", "port"})."""
        r = self.call("socket_listen")
        return r["socket"], {"address": r["address"], "port": r["port"]}

    def socket_connect(self, peer: Mapping[str, object]) -> int:
        """A socket connected to the listener at ``peer`` (the listening child accepts by itself)."""
        r = self.call("socket_connect", peer=peer)
        socket: int = r["socket"]
        return socket

    def op_wait(self, op_id: int, timeout: float | None = 10.0) -> dict[str, Any]:
        """{"status", "bytes", "wc_status"} of a completed operation; TimeoutError after ``timeout``."""
        reply_timeout = None if timeout is None else timeout + self.reply_timeout
        done: dict[str, Any] = self.request("op_wait", {"op_id": op_id, "timeout": timeout}, reply_timeout)
        return done

    def kill(self) -> None:
        """End the process at once: the kernel releases its QPs, MRs and windows with it."""
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=30)
        self._close_pipes()

    def close(self, timeout: float = 30.0) -> None:
        """Ask the child to release everything and exit (stdin EOF); kill it if it does not."""
        if self._proc.poll() is None:
            try:
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
            except OSError:
                pass
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def __enter__(self) -> ChildProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
