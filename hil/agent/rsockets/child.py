"""A process under test that calls rsockets (librdmacm's ``rsocket`` API) as told, one JSON line at a time.

    python3 child.py [--address 10.0.0.1] [--library librdmacm.so.1]

The agent starts one per process under test (``hil.agent.observe.driver``) so that whatever rsockets does
happens in a process of its own: the kernel's record of that process is what gets judged, a call that hangs
is ended by killing the process (the agent names the call), and what the process leaves behind when it exits
can be read. Standard library and ``ctypes`` only, Python 3.9+; it runs as a script.

First line out: ``{"id": 0, "result": {"pid", "library"}}``, or ``{"id": 0, "error": ...}`` and exit 2 when the
library or its rsocket calls cannot be loaded. Then each request ``{"id", "call", "args": {...}}`` gets
``{"id", "result"}`` or ``{"id", "error": {"call", "errno", "message"}}``. A request with ``"background": true``
runs in a thread of its own (``accept`` blocks until a peer connects, and the peer's ``connect`` is another
request to another process): its reply comes when it returns, the next requests are answered meanwhile.
Bytes travel as base64 strings. On ``exit`` or stdin EOF the process exits without closing anything: what
rsockets and the kernel release then is part of what is judged.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import ctypes.util
import mmap
import os
import socket
import struct
import sys
from typing import Any

if __package__ in (None, ""):  # run as a script by the agent: its tree is importable from two levels up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from hil.agent.observe.serve import CallFailed, Server, own_stdout

SOL_RDMA = 0x10000  # rsocket.h
RDMA_IOMAPSIZE = 3
PROT_WRITE = 0x2
CALLS = ("rsocket", "rbind", "rlisten", "raccept", "rconnect", "rsend", "rrecv", "riomap", "riounmap", "riowrite",
         "rsetsockopt", "rgetsockname", "rclose")


class Library(ctypes.CDLL):
    """A C library and the path it was loaded from (for messages)."""

    path: str


def load(name: str | None) -> Library:
    """librdmacm with the rsocket calls typed."""
    path = name or ctypes.util.find_library("rdmacm") or "librdmacm.so.1"
    lib = Library(path, use_errno=True)
    vp, sz, ssz, off, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_long, ctypes.c_int
    types: dict[str, tuple[Any, list[Any]]] = {
        "rsocket": (i, [i, i, i]), "rbind": (i, [i, vp, ctypes.c_uint32]), "rlisten": (i, [i, i]),
        "raccept": (i, [i, vp, vp]), "rconnect": (i, [i, vp, ctypes.c_uint32]),
        "rsend": (ssz, [i, vp, sz, i]), "rrecv": (ssz, [i, vp, sz, i]),
        "riomap": (off, [i, vp, sz, i, i, off]), "riounmap": (i, [i, vp, sz]),
        "riowrite": (ssz, [i, vp, sz, off, i]),  # size_t in rsocket.h; -1 on error
        "rsetsockopt": (i, [i, i, i, vp, ctypes.c_uint32]), "rgetsockname": (i, [i, vp, vp]), "rclose": (i, [i]),
    }
    for call, (restype, argtypes) in types.items():
        fn = getattr(lib, call)  # AttributeError: this librdmacm has no rsockets
        fn.restype, fn.argtypes = restype, argtypes
    lib.path = path
    return lib


def sockaddr(address: str, port: int) -> ctypes.Array[ctypes.c_char]:
    raw = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(address) + bytes(8)
    return ctypes.create_string_buffer(raw, len(raw))


class Rsockets:
    """The calls a request names, on one librdmacm; buffers are page-aligned anonymous mappings by id."""

    def __init__(self, lib: ctypes.CDLL, address: str | None) -> None:
        self.lib = lib
        self.address = address or "0.0.0.0"
        self.buffers: dict[int, mmap.mmap] = {}

    def _check(self, call: str, ret: int) -> int:
        if ret < 0:
            raise CallFailed(call, ctypes.get_errno())
        return ret

    def _addr(self, buf: int) -> int:
        mem = self.buffers[buf]
        return ctypes.addressof(ctypes.c_char.from_buffer(mem))

    # -- memory ---------------------------------------------------------------------------------------
    def alloc(self, length: int) -> dict[str, int]:
        mem = mmap.mmap(-1, length)
        ident = len(self.buffers) + 1
        self.buffers[ident] = mem
        return {"buf": ident, "address": self._addr(ident), "length": length}

    def fill(self, buf: int, data: str, offset: int = 0) -> None:
        raw = base64.b64decode(data)
        self.buffers[buf][offset:offset + len(raw)] = raw

    def peek(self, buf: int, length: int, offset: int = 0) -> str:
        return base64.b64encode(self.buffers[buf][offset:offset + length]).decode()

    # -- rsockets -------------------------------------------------------------------------------------
    def rsocket(self) -> int:
        return self._check("rsocket", self.lib.rsocket(socket.AF_INET, socket.SOCK_STREAM, 0))

    def iomapsize(self, fd: int, slots: int) -> int:
        value = ctypes.c_int(slots)
        return self._check("rsetsockopt", self.lib.rsetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, ctypes.byref(value),
                                                               ctypes.sizeof(value)))

    def listen(self, fd: int, port: int = 0, backlog: int = 4) -> dict[str, Any]:
        where = sockaddr(self.address, port)
        self._check("rbind", self.lib.rbind(fd, where, len(where)))
        self._check("rlisten", self.lib.rlisten(fd, backlog))
        out = ctypes.create_string_buffer(16)
        size = ctypes.c_uint32(16)
        self._check("rgetsockname", self.lib.rgetsockname(fd, out, ctypes.byref(size)))
        return {"address": self.address, "port": struct.unpack_from("!H", out.raw, 2)[0]}

    def accept(self, fd: int) -> int:
        return self._check("raccept", self.lib.raccept(fd, None, None))

    def connect(self, fd: int, address: str, port: int) -> int:
        where = sockaddr(address, port)
        return self._check("rconnect", self.lib.rconnect(fd, where, len(where)))

    def send(self, fd: int, data: str) -> int:
        raw = base64.b64decode(data)
        return self._check("rsend", self.lib.rsend(fd, raw, len(raw), 0))

    def recv(self, fd: int, length: int) -> str:
        out = ctypes.create_string_buffer(length)
        got = self._check("rrecv", self.lib.rrecv(fd, out, length, 0))
        return base64.b64encode(out.raw[:got]).decode()

    def iomap(self, fd: int, buf: int, offset: int = -1, length: int | None = None) -> int:
        size = len(self.buffers[buf]) if length is None else length
        return self._check("riomap", self.lib.riomap(fd, self._addr(buf), size, PROT_WRITE, 0, offset))

    def iounmap(self, fd: int, buf: int, length: int | None = None) -> int:
        size = len(self.buffers[buf]) if length is None else length
        return self._check("riounmap", self.lib.riounmap(fd, self._addr(buf), size))

    def iowrite(self, fd: int, data: str, offset: int) -> int:
        raw = base64.b64decode(data)
        return self._check("riowrite", self.lib.riowrite(fd, raw, len(raw), offset, 0))

    def close(self, fd: int) -> int:
        ret = self.lib.rclose(fd)  # returns EBADF itself (not -1 with errno) for an unknown socket
        if ret != 0:
            raise CallFailed("rclose", ret if ret > 0 else ctypes.get_errno())
        return 0


METHODS = ("alloc", "fill", "peek", "rsocket", "iomapsize", "listen", "accept", "connect", "send", "recv", "iomap",
           "iounmap", "iowrite", "close")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-san-rsockets-child")
    parser.add_argument("--address", help="the IPv4 address to bind listening sockets to")
    parser.add_argument("--library", help="the librdmacm to load (default: librdmacm.so.1 as found)")
    args = parser.parse_args(argv)
    server = Server(None, METHODS, own_stdout())
    try:
        lib = load(args.library)
    except (OSError, AttributeError) as exc:
        server.refuse_to_start(f"no rsockets here: cannot load librdmacm's rsocket calls ({exc})")
        return 2
    server.calls = Rsockets(lib, args.address)
    server.hello({"library": lib.path})
    server.serve(sys.stdin.buffer)
    sys.stdout.flush()
    os._exit(0)  # no atexit, no destructors: what rsockets leaves is what the kernel must release


if __name__ == "__main__":
    sys.exit(main())
