"""The child process of the verbs engine: one modelled process, answering JSON lines on stdin.

    python3 child.py --device rxe0 --port 1 [--address 10.0.0.1] [--mw-mode auto|mw2|mr]

First line out: ``{"id": 0, "result": hello}`` once the device is open, or ``{"id": 0, "error": ...}``
and exit 2 when it cannot be (no RDMA device, no pyverbs, port down, no address for the connection
manager). Then each request ``{"id", "method", "params"}`` for one of ``hil.rpc.methods.CHILD`` gets
``{"id", "result"}`` or ``{"id", "error": {"code": <WSA code or null>, "kind", "message", "required_size"}}``
(``hil.rpc.errors``). Bytes travel as ``{"$b": base64}`` (``hil.rpc.framing``). Between requests the
child handles its sockets' connection manager events (a connect request for a listening socket is
accepted, a peer's disconnect reported): it waits on stdin and on their event channels at once, so a
peer connecting to it never waits for a request to reach it. On stdin EOF (or SIGTERM) everything
is released explicitly and the process exits. Standard library + pyverbs, Python 3.9 compatible;
runs as a script.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Iterable
from types import FrameType
from typing import IO

if __package__ in (None, ""):  # run as a script: make ``hil.agent.engines.verbs`` importable from the tree
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4)))

from hil.rpc.errors import describe
from hil.rpc.framing import decode, encode
from hil.rpc.methods import CHILD

SYSFS = "/sys/class/infiniband"


def _emit(out: IO[bytes], message: dict[str, object]) -> None:
    out.write(encode(message))
    out.flush()


def _answer(proc: object, line: bytes, out: IO[bytes]) -> bool:
    """Answer one request line; False after ``exit``."""
    if not line.strip():
        return True
    rid: int | None = None
    try:
        request = decode(line)
        rid = request.get("id")
        method = request["method"]
        params = request.get("params") or {}
        if method not in CHILD:
            raise LookupError(f"no method {method!r}")
        if method == "exit":
            _emit(out, {"id": rid, "result": None})
            return False
        result = getattr(proc, method)(**params)
        _emit(out, {"id": rid, "result": result})
    except Exception as exc:  # every failure goes back, named
        _emit(out, {"id": rid, "error": describe(exc)})
    return True


def serve(proc: object, inp: Iterable[bytes], out: IO[bytes]) -> None:
    """Answer requests to ``proc`` (a VerbsProcess) until EOF or ``exit``."""
    for line in inp:
        if not _answer(proc, line, out):
            return


def serve_fd(proc: object, fd: int, out: IO[bytes]) -> None:
    """``serve`` on a file descriptor, handling ``proc``'s connection manager events (``cm_fds``,
    ``pump``) whenever one is waiting, between requests."""
    pending = b""
    while True:
        cm_fds = list(proc.cm_fds()) if hasattr(proc, "cm_fds") else []
        ready, _, _ = select.select([fd, *cm_fds], [], [])
        if any(r != fd for r in ready) and hasattr(proc, "pump"):  # only the verbs process pumps
            proc.pump()
        if fd not in ready:
            continue
        chunk = os.read(fd, 1 << 16)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop() if chunk else b""
        for line in lines:
            if not _answer(proc, line, out):
                return
        if not chunk:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-san-verbs-child")
    parser.add_argument("--device", required=True)
    parser.add_argument("--port", type=int, default=1)
    parser.add_argument("--address", help="the IP address the connection manager binds to (default: the "
                        "device's netdev's)")
    parser.add_argument("--mw-mode", default="auto", choices=("auto", "mw2", "mr"))
    args = parser.parse_args(argv)
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but protocol lines on the real stdout
    try:
        from hil.agent.engines.verbs.process import VerbsProcess
    except ImportError as exc:
        _emit(out, {"id": 0, "error": describe(ImportError(f"pyverbs not importable ({sys.executable}): {exc}"))})
        return 2
    try:
        proc = VerbsProcess(args.device, port=args.port, address=args.address, mw_mode=args.mw_mode)
    except Exception as exc:
        error = describe(exc)
        why = f"cannot open RDMA device {args.device!r} port {args.port}: {error['message']}"
        if not os.path.isdir(SYSFS) or "devices list" in why:  # get_device_list() raises when there is none
            why = f"no RDMA device ({SYSFS} {'absent' if not os.path.isdir(SYSFS) else 'lists none usable'}); {why}"
        error["message"] = why
        _emit(out, {"id": 0, "error": error})
        return 2

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    try:
        _emit(out, {"id": 0, "result": proc.hello()})
        serve_fd(proc, sys.stdin.fileno(), out)
    except (SystemExit, KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        proc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
