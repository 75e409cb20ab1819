"""The request loop of a child program under observation: one JSON line in, one out (``driver`` speaks the other
end). Standard library only, Python 3.9+: the children import it when run as scripts (``program_root``).

Each request ``{"id", "call", "args": {...}}`` gets ``{"id", "result"}`` or ``{"id", "error": {"call", "errno",
"message"}}``. A request with ``"background": true`` runs in a thread of its own, and the next requests are
answered meanwhile. ``exit`` (or the end of input) ends the loop.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import IO, Any


class CallFailed(Exception):
    """A call that failed with an errno (``code``, 0 when there is none)."""

    def __init__(self, call: str, code: int, message: str | None = None) -> None:
        super().__init__(message or f"{call}: {os.strerror(code) if code else 'failed'} (errno {code})")
        self.call, self.code = call, code


class Server:
    def __init__(self, calls: object, methods: tuple[str, ...], out: IO[bytes]) -> None:
        self.calls = calls
        self.methods = methods
        self.out = out
        self._lock = threading.Lock()

    def emit(self, message: dict[str, Any]) -> None:
        line = (json.dumps(message) + "\n").encode()
        with self._lock:
            self.out.write(line)
            self.out.flush()

    def hello(self, result: dict[str, Any]) -> None:
        self.emit({"id": 0, "result": {"pid": os.getpid(), **result}})

    def refuse_to_start(self, why: str) -> None:
        self.emit({"id": 0, "error": {"call": None, "errno": None, "message": why}})

    def answer(self, rid: Any, call: str, args: dict[str, Any]) -> None:
        try:
            if call not in self.methods:
                raise LookupError(f"no call {call!r} (known: {', '.join(self.methods)})")
            fn: Callable[..., Any] = getattr(self.calls, call)
            self.emit({"id": rid, "result": fn(**args)})
        except CallFailed as exc:
            self.emit({"id": rid, "error": {"call": exc.call, "errno": exc.code, "message": str(exc)}})
        except Exception as exc:  # a bad request: named, and the process goes on
            self.emit({"id": rid, "error": {"call": call, "errno": None, "message": f"{type(exc).__name__}: {exc}"}})

    def serve(self, inp: IO[bytes]) -> None:
        for line in inp:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                rid, call, args = request.get("id"), request["call"], request.get("args") or {}
            except (ValueError, KeyError, AttributeError) as exc:
                self.emit({"id": None, "error": {"call": None, "errno": errno.EINVAL,
                                                 "message": f"not a request ({exc}): {line[:200]!r}"}})
                continue
            if call == "exit":
                self.emit({"id": rid, "result": None})
                return
            if request.get("background"):
                threading.Thread(target=self.answer, args=(rid, call, args), daemon=True).start()
            else:
                self.answer(rid, call, args)


def own_stdout() -> IO[bytes]:
    """The protocol's output; whatever else the program prints goes to stderr."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr
    return out
