"""The host side of the verbs engine (runs in the agent's main process on a lab host).

* device selection: ``select_device(name)`` -> (device, port) -- the named device or the first with
  an ACTIVE port; ``select_gid_index`` -> the given index or the first RoCE v2 IPv4-mapped GID.
  With no device at all this raises ``NoRdmaDevice`` with a plain reason (pyverbs'
  ``get_device_list()`` raises rather than returning [] then);
* ``ChildProcess``: one modelled process = one child OS process running ``child.py`` (its own
  Context/PD/CQ), and a small JSON-lines client for it; ``kill()`` ends it (its registrations
  vanish with it);
* ``PinnedProxy``: the proxy driver's part on a real host -- pinned memory (mmap + mlock),
  physical addresses from /proc/self/pagemap (root only), contiguous memory from hugetlb pages,
  DMA adapters whose common buffers are such contiguous blocks -- with capabilities declared
  only for what this host really gives.

Standard library only at import time (pyverbs is imported lazily, where present); Python 3.9+.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from typing import Any

from hil.agent.engines.verbs.libc import MAP_HUGETLB, libc, map_anonymous
from hil.rpc.framing import decode, encode
from pytest_san.contract import (
    DO_DIRECT_IO,
    FOUR_GIB,
    MAX_DESCRIPTION_VERSION,
    PAGE_SIZE,
    CacheType,
    SanError,
    WsaError,
    is_int,
)

SYSFS = "/sys/class/infiniband"
HUGE_PAGE_SIZE = 2 << 20
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")


class NoRdmaDevice(RuntimeError):
    """There is no usable RDMA device on this host; the message says why."""


# -- device selection --------------------------------------------------------------------------------


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def list_devices(sysfs: str = SYSFS) -> list[str]:
    """The RDMA devices of this host, or NoRdmaDevice naming why there are none."""
    if os.path.isdir(sysfs):
        names = sorted(os.listdir(sysfs))
        if names:
            return names
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is empty")
    try:
        from pyverbs.device import get_device_list  # type: ignore[import-not-found]
    except ImportError:
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is absent") from None
    try:
        devices = get_device_list()  # raises (rather than returning []) when there is none
    except Exception as exc:
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is absent and get_device_list() failed: {exc}") from None
    if not devices:
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is absent and get_device_list() is empty")
    return sorted(d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices)


def port_states(device: str, sysfs: str = SYSFS) -> dict[int, str]:
    """{port number: state text} of a device, e.g. {1: "4: ACTIVE"}."""
    ports = os.path.join(sysfs, device, "ports")
    out = {}
    if os.path.isdir(ports):
        for name in sorted(os.listdir(ports), key=lambda n: int(n) if n.isdigit() else 0):
            try:
                out[int(name)] = _read(os.path.join(ports, name, "state"))
            except (OSError, ValueError):
                continue
    return out


def select_device(name: str | None = None, sysfs: str = SYSFS) -> tuple[str, int]:
    """(device, port): ``name`` (san_device) or the first device with an ACTIVE port."""
    devices = list_devices(sysfs)
    if name is not None:
        if name not in devices:
            raise NoRdmaDevice("RDMA device {!r} not found (this host has {})".format(name, ", ".join(devices)))
        candidates = [name]
    else:
        candidates = devices
    seen = []
    for dev in candidates:
        states = port_states(dev, sysfs)
        for port, state in states.items():
            if "ACTIVE" in state.upper().split(":")[-1]:
                return dev, port
        seen.append("{} {}".format(dev, states or "(no ports)"))
    raise NoRdmaDevice("no RDMA device with an ACTIVE port: {}".format("; ".join(seen)))


def gid_table(device: str, port: int, sysfs: str = SYSFS) -> list[tuple[int, str, str]]:
    """(index, gid as 32 hex digits, type text) of the non-zero GIDs of a port."""
    base = os.path.join(sysfs, device, "ports", str(port))
    out: list[tuple[int, str, str]] = []
    gids = os.path.join(base, "gids")
    if not os.path.isdir(gids):
        return out
    for name in sorted(os.listdir(gids), key=lambda n: int(n) if n.isdigit() else -1):
        if not name.isdigit():
            continue
        try:
            gid = _read(os.path.join(gids, name)).replace(":", "").lower()
        except OSError:  # reading an unset entry of a RoCE table fails with EINVAL
            continue
        if not gid or int(gid, 16) == 0:
            continue
        try:
            kind = _read(os.path.join(base, "gid_attrs", "types", name))
        except OSError:
            kind = ""
        out.append((int(name), gid, kind))
    return out


def select_gid_index(device: str, port: int, given: int | None = None, sysfs: str = SYSFS) -> int:
    """``given`` (san_gid_index) when it names a GID; else the first RoCE v2 IPv4-mapped GID; else 0."""
    table = gid_table(device, port, sysfs)
    if given is not None:
        if table and given not in [i for i, _, _ in table]:
            raise NoRdmaDevice(f"GID index {given} of {device} port {port} is not set "
                               f"(set: {[i for i, _, _ in table]})")
        return given
    v4_mapped = "00000000000000000000ffff"
    for wanted in (lambda g, k: "v2" in k.lower() and g.startswith(v4_mapped),
                   lambda g, k: "v2" in k.lower(),
                   lambda g, k: True):
        for index, gid, kind in table:
            if wanted(gid, kind):
                return index
    return 0


def pyverbs_python(candidates: Iterable[str] = ()) -> str | None:
    """An interpreter that can import pyverbs: this one, or the system's /usr/bin/python3."""
    seen = []
    for python in [*list(candidates), sys.executable, "/usr/bin/python3"]:
        if not python or python in seen or not os.path.exists(python):
            continue
        seen.append(python)
        try:
            done = subprocess.run([python, "-c", "import pyverbs.device, pyverbs.mr"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return python
    return None


# -- child processes ----------------------------------------------------------------------------------


class ChildGone(ConnectionError):
    """The child process exited (or was killed) while a reply was awaited."""


class ChildFailure(RuntimeError):
    """A request failed in the child for a reason that is not a Winsock error."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"{kind}: {message}")


def raise_error(error: dict[str, Any]) -> None:
    """Turn a child's error object into the exception it stands for."""
    code = error.get("code")
    message = error.get("message") or ""
    if code is not None:
        raise SanError(int(code), message, required_size=error.get("required_size"))
    kind = error.get("kind") or "Error"
    if kind == "TimeoutError":
        raise TimeoutError(message)
    if kind == "ValueError":
        raise ValueError(message)
    if kind == "TypeError":
        raise TypeError(message)
    raise ChildFailure(kind, message)


class ChildProcess:
    """One modelled process: a child running ``child.py`` with its own verbs Context, and its client.

    ``hello`` holds what the child reported once its device was open (pid, device, gid, ...).
    Calls are serialised (one request at a time); ``call`` raises SanError for Winsock errors,
    TimeoutError for an operation wait that timed out, ChildGone when the child died.
    """

    _ids = itertools.count(1)

    def __init__(self, device: str, port: int = 1, gid_index: int = 0, python: str | None = None,
                 mw_mode: str = "auto", start_timeout: float = 120.0, env: dict[str, str] | None = None) -> None:
        self.python = python or sys.executable
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the child
        cmd = [self.python, CHILD, "--device", device, "--port", str(port), "--gid-index", str(gid_index),
               "--mw-mode", mw_mode]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      env=env, close_fds=True)
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_loop, name=f"san-child-{self._proc.pid}", daemon=True)
        self._reader.start()
        self._lock = threading.Lock()
        self.pid = self._proc.pid  # the OS pid (the child reports the same in hello)
        try:
            reply = self._next_line(start_timeout)
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
        self.hello: dict[str, Any] = reply["result"]

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

    def call(self, method: str, **params: Any) -> Any:
        """One request with keyword parameters; waits ``reply_timeout`` seconds for the reply."""
        return self.request(method, params, self.reply_timeout)

    def request(self, method: str, params: dict[str, Any], reply_timeout: float | None) -> Any:
        """One request; ``reply_timeout`` bounds the wait for the reply (None: forever)."""
        with self._lock:
            if not self.alive:
                raise ChildGone(f"child {self._proc.pid} is gone (code {self._proc.returncode})")
            rid = next(self._ids)
            stdin = self._proc.stdin
            assert stdin is not None
            try:
                stdin.write(encode({"id": rid, "method": method, "params": params}))
                stdin.flush()
            except (BrokenPipeError, OSError):
                raise ChildGone(f"child {self._proc.pid} is gone: {self.stderr_tail()}") from None
            while True:
                reply = self._next_line(reply_timeout)
                if reply.get("id") == rid:
                    break
        if "error" in reply:
            raise_error(reply["error"])
        return reply.get("result")

    # Convenience wrappers (the names of the provider calls).
    def alloc(self, nbytes: int) -> tuple[int, int]:
        r = self.call("alloc", nbytes=nbytes)
        return r["address"], r["length"]

    def read(self, address: int, length: int) -> bytes:
        data: bytes = self.call("read", address=address, length=length)
        return data

    def write(self, address: int, data: bytes) -> None:
        self.call("write", address=address, data=bytes(data))

    def socket_create(self) -> tuple[int, dict[str, Any]]:
        r = self.call("socket_create")
        return r["socket"], r["info"]

    def socket_connect(self, socket: int, peer_info: dict[str, Any]) -> None:
        self.call("socket_connect", socket=socket, peer=peer_info)

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

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- the proxy: pinned, physical and contiguous memory ------------------------------------------------

_PFN_MASK = (1 << 55) - 1
_PRESENT = 1 << 63


def _touch(address: int, size: int, step: int = PAGE_SIZE) -> None:
    """Fault every page in (writing zeros), so the pagemap names real frames."""
    for offset in range(0, size, step):
        ctypes.memset(address + offset, 0, 1)


def physical_frames(address: int, size: int) -> list[int]:
    """Physical page-frame numbers of the pages of [address, address+size); 0 where not known.

    /proc/self/pagemap gives PFNs (bits 0-54, with bit 63 = present) only to root (CAP_SYS_ADMIN);
    others read zeros.
    """
    first = address // PAGE_SIZE
    count = -(-(address + size) // PAGE_SIZE) - first
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            raw = f.read(count * 8)
    except OSError:
        return [0] * count
    frames = []
    for i in range(count):
        entry = int.from_bytes(raw[i * 8:i * 8 + 8], "little") if len(raw) >= i * 8 + 8 else 0
        frames.append(entry & _PFN_MASK if entry & _PRESENT else 0)
    return frames


def physical_runs(address: int, size: int) -> tuple[tuple[int, int], ...]:
    """(physical address, bytes) runs backing [address, address+size), or () when unknown."""
    frames = physical_frames(address, size)
    if not frames or not all(frames):
        return ()
    runs: list[list[int]] = []
    offset = address % PAGE_SIZE
    remaining = size
    for i, pfn in enumerate(frames):
        start = pfn * PAGE_SIZE + (offset if i == 0 else 0)
        nbytes = min(remaining, PAGE_SIZE - (offset if i == 0 else 0))
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1][1] += nbytes
        else:
            runs.append([start, nbytes])
        remaining -= nbytes
    return tuple((a, n) for a, n in runs)


class HostAllocation:
    """Pinned memory the proxy handed out (implements the Allocation protocol)."""

    __slots__ = ("address", "id", "length", "physical_runs", "size")

    def __init__(self, id: int, address: int, length: int, size: int, runs: tuple[tuple[int, int], ...]) -> None:
        self.id = id
        self.address = address  # user virtual address of the pinned pages
        self.length = length
        self.size = size
        self.physical_runs = runs

    def __repr__(self) -> str:
        return f"<HostAllocation #{self.id}: {self.length} bytes at {self.address:#x}>"


class _Block:
    __slots__ = ("address", "cache_type", "nbytes", "size")

    def __init__(self, address: int, size: int, nbytes: int, cache_type: int) -> None:
        self.address = address
        self.size = size
        self.nbytes = nbytes
        self.cache_type = cache_type


def _field(description: Any, name: str) -> Any:
    if isinstance(description, dict):
        return description.get(name)
    return getattr(description, name, None)


_DESCRIPTION_FIELDS = ("version", "master", "scatter_gather", "dma32", "dma64", "maximum_length", "interface_type")
_DESCRIPTION_INTS = ("version", "maximum_length", "interface_type")
_DESCRIPTION_FLAGS = ("master", "scatter_gather", "dma32", "dma64")


def _integers(call: str, **values: Any) -> None:
    """Refuse, before anything changes, a size or address that is not an int (True and 1.0 are not)."""
    bad = [f"{name} {value!r}" for name, value in values.items() if not is_int(value)]
    if bad:
        raise SanError(WsaError.WSAEINVAL, "{}: not integers: {}".format(call, ", ".join(bad)))


def _flag(call: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise SanError(WsaError.WSAEINVAL, f"{call}: {name} must be True or False, got {value!r}")


def _cache_type(value: Any) -> None:
    if not is_int(value) or value not in tuple(CacheType):
        raise SanError(WsaError.WSAEINVAL, f"unknown cache type {value!r}")


class HostDmaAdapter:
    """IoGetDmaAdapter's adapter on a Linux host: common buffers are pinned hugetlb blocks (P5)."""

    def __init__(self, owner: PinnedProxy, id: int, description: dict[str, Any]) -> None:
        self._owner = owner
        self.id = id
        self.description = description
        self._dma32 = not description.get("dma64")
        self._buffers: dict[int, tuple[int, int, bool]] = {}  # logical -> (length, virtual, cache_enabled)
        self.put = False

    @property
    def dma32(self) -> bool:
        return self._dma32

    @property
    def common_buffers(self) -> int:
        return len(self._buffers)

    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        if self.put:
            raise SanError(WsaError.WSAEINVAL, f"allocate_common_buffer: DMA adapter #{self.id} was already put")
        _integers("allocate_common_buffer", length=length)
        _flag("allocate_common_buffer", "cache_enabled", cache_enabled)
        if length <= 0:
            return None
        highest = FOUR_GIB - 1 if self._dma32 else (1 << 64) - 1
        got = self._owner._contiguous_block(length, 0, highest, 0)
        if got is None:
            return None
        virtual, logical, size = got
        self._buffers[logical] = (length, virtual, bool(cache_enabled))
        self._owner._common[logical] = size
        return virtual, logical

    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        if self.put:
            raise SanError(WsaError.WSAEINVAL, f"free_common_buffer: DMA adapter #{self.id} was already put")
        _integers("free_common_buffer", length=length, logical=logical, virtual=virtual)
        _flag("free_common_buffer", "cache_enabled", cache_enabled)
        buf = self._buffers.get(logical)
        if buf is None:
            raise SanError(WsaError.WSAEINVAL, f"free_common_buffer: no common buffer at logical {logical:#x} "
                           f"on adapter #{self.id}")
        want_length, want_virtual, want_cache = buf
        wrong = []
        if length != want_length:
            wrong.append(f"length {length} differs from allocated {want_length}")
        if virtual != want_virtual:
            wrong.append(f"virtual address {virtual:#x} differs from {want_virtual:#x}")
        if bool(cache_enabled) != want_cache:
            wrong.append(f"cache_enabled {bool(cache_enabled)} differs from {want_cache}")
        if wrong:
            raise SanError(WsaError.WSAEINVAL,
                           "free_common_buffer at logical {:#x}: {}".format(logical, "; ".join(wrong)))
        del self._buffers[logical]
        size = self._owner._common.pop(logical)
        self._owner._release_block(want_virtual, size)


class PinnedProxy:
    """The proxy driver on a real host (P1, P2, P4, P5 where the host allows; never P3/NOLOWMEM).

    ``allocate`` pins (mmap + mlock) and reports physical runs when /proc/self/pagemap gives
    frame numbers (root). ``allocate_contiguous`` uses 2 MiB hugetlb pages: physically contiguous
    by construction; it returns None when the host has no hugetlb pages, when physical addresses
    cannot be read, or when no page meets the bounds. Linux user space cannot choose a caching
    type: ``cache_type`` is validated and remembered (free must repeat it), not applied.
    """

    def __init__(self, name: str = "host") -> None:
        self.name = name
        self._ids = itertools.count(1)
        self._allocations: dict[int, HostAllocation] = {}
        self._contiguous: dict[int, tuple[_Block, int]] = {}  # base physical -> (block, virtual)
        self._common: dict[int, int] = {}  # logical -> mapped size, for adapters' common buffers
        self._adapters: dict[int, HostDmaAdapter] = {}
        self._adapter_ids = itertools.count(1)
        self._caps: frozenset[str] | None = None

    # -- P1, P3 ---------------------------------------------------------------------------------

    @property
    def device_flags(self) -> int:
        return DO_DIRECT_IO

    @property
    def nolowmem(self) -> bool:
        return False  # a Linux host has no NOLOWMEM mode to switch on

    def set_nolowmem(self, value: bool) -> None:
        if value:
            raise SanError(WsaError.WSAEOPNOTSUPP,
                           "NOLOWMEM cannot be set on a Linux host (capability 'nolowmem' absent)")

    # -- capabilities ---------------------------------------------------------------------------

    def capabilities(self) -> frozenset[str]:
        """What this host's proxy really gives: "physical_addresses" (pagemap PFNs), "contiguous" (hugetlb)."""
        if self._caps is None:
            caps = set()
            address = map_anonymous(PAGE_SIZE)
            if address is not None:
                _touch(address, PAGE_SIZE)
                if all(physical_frames(address, PAGE_SIZE)):
                    caps.add("physical_addresses")
                libc.munmap(address, PAGE_SIZE)
            if "physical_addresses" in caps:
                huge = map_anonymous(HUGE_PAGE_SIZE, MAP_HUGETLB)
                if huge is not None:
                    try:
                        _touch(huge, HUGE_PAGE_SIZE, HUGE_PAGE_SIZE)
                        if all(physical_frames(huge, PAGE_SIZE)):
                            caps.add("contiguous")
                    finally:
                        libc.munmap(huge, HUGE_PAGE_SIZE)
            self._caps = frozenset(caps)
        return self._caps

    # -- P2 -------------------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> HostAllocation:
        if not is_int(nbytes) or nbytes <= 0:
            raise SanError(WsaError.WSAEINVAL, f"proxy of {self.name}: cannot allocate {nbytes!r} bytes")
        size = -(-nbytes // PAGE_SIZE) * PAGE_SIZE
        address = map_anonymous(size)
        if address is None:
            raise SanError(WsaError.WSAENOBUFS, f"proxy of {self.name}: mmap of {size} bytes failed: "
                           f"{os.strerror(ctypes.get_errno())}")
        if libc.mlock(address, size) != 0:
            err = ctypes.get_errno()
            libc.munmap(address, size)
            raise SanError(WsaError.WSAENOBUFS, f"proxy of {self.name}: mlock of {size} bytes failed: "
                           f"{os.strerror(err)} (RLIMIT_MEMLOCK?)")
        allocation = HostAllocation(next(self._ids), address, nbytes, size, physical_runs(address, nbytes))
        self._allocations[allocation.id] = allocation
        return allocation

    def free(self, allocation: Any) -> None:
        aid = getattr(allocation, "id", allocation)
        mine = self._allocations.get(aid) if is_int(aid) else None
        if mine is None or (isinstance(allocation, HostAllocation) and mine is not allocation):
            raise SanError(WsaError.WSAEINVAL, f"free: {allocation!r} is not a live allocation of the proxy of "
                                      f"{self.name} (double free?)")
        del self._allocations[mine.id]
        self._release_block(mine.address, mine.size)

    # -- P4 -------------------------------------------------------------------------------------

    def _contiguous_block(self, nbytes: int, lowest: int, highest: int, boundary: int,
                          attempts: int = 4) -> tuple[int, int, int] | None:
        """(virtual, physical base, mapped size) of a pinned, physically contiguous block, or None."""
        if "contiguous" not in self.capabilities():
            return None
        size = -(-nbytes // HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE
        rejected = []
        try:
            for _ in range(attempts):
                address = map_anonymous(size, MAP_HUGETLB)
                if address is None:
                    return None
                if libc.mlock(address, size) != 0:
                    libc.munmap(address, size)
                    return None
                _touch(address, size, HUGE_PAGE_SIZE)
                frames = physical_frames(address, size)
                contiguous = all(frames) and all(frames[i + 1] == frames[i] + 1 for i in range(len(frames) - 1))
                base = frames[0] * PAGE_SIZE if frames else 0
                last = base + nbytes - 1
                fits = contiguous and base >= lowest and last <= highest and (
                    not boundary or base // boundary == last // boundary)
                if fits:
                    return address, base, size
                rejected.append(address)  # keep it while trying others, so the next try gets other pages
            return None
        finally:
            for address in rejected:
                self._release_block(address, size)

    def _release_block(self, address: int, size: int) -> None:
        libc.munlock(address, size)
        libc.munmap(address, size)

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: int) -> int | None:
        _integers("allocate_contiguous", nbytes=nbytes, lowest=lowest, highest=highest, boundary=boundary)
        _cache_type(cache_type)
        if nbytes <= 0 or lowest < 0 or highest < 0 or boundary < 0:
            raise SanError(WsaError.WSAEINVAL,
                           f"allocate_contiguous({nbytes!r}, {lowest!r}, {highest!r}, {boundary!r}): "
                                      "the size must be positive, addresses and boundary not negative")
        got = self._contiguous_block(nbytes, lowest, highest, boundary)
        if got is None:
            return None
        virtual, base, size = got
        self._contiguous[base] = (_Block(virtual, size, nbytes, int(cache_type)), virtual)
        return base

    def free_contiguous(self, base: int, nbytes: int, cache_type: int) -> None:
        _integers("free_contiguous", base=base, nbytes=nbytes)
        _cache_type(cache_type)
        entry = self._contiguous.get(base)
        if entry is None:
            raise SanError(WsaError.WSAEINVAL,
                           f"free_contiguous: no contiguous block of {self.name} starts at {base:#x}")
        block, virtual = entry
        wrong = []
        if nbytes != block.nbytes:
            wrong.append(f"size {nbytes} differs from allocated {block.nbytes}")
        if int(cache_type) != block.cache_type:
            wrong.append(f"cache type {cache_type!r} differs from {block.cache_type}")
        if wrong:
            raise SanError(WsaError.WSAEINVAL, "free_contiguous at {:#x}: {}".format(base, "; ".join(wrong)))
        del self._contiguous[base]
        self._release_block(virtual, block.size)

    # -- P5 -------------------------------------------------------------------------------------

    def get_dma_adapter(self, description: Any) -> HostDmaAdapter:
        missing = [n for n in _DESCRIPTION_FIELDS if _field(description, n) is None]
        if missing:
            raise SanError(WsaError.WSAEINVAL, "get_dma_adapter: DEVICE_DESCRIPTION was not zero-initialised; "
                           "uninitialised fields: {}".format(", ".join(missing)))
        values = {n: _field(description, n) for n in _DESCRIPTION_FIELDS}
        problems = [f"{n} must be an integer, got {values[n]!r}" for n in _DESCRIPTION_INTS if not is_int(values[n])]
        problems += [f"{n} must be True or False, got {values[n]!r}" for n in _DESCRIPTION_FLAGS
                     if not isinstance(values[n], bool)]
        if problems:
            raise SanError(WsaError.WSAEINVAL, "get_dma_adapter: {}".format("; ".join(problems)))
        if values["master"] is not True:
            problems.append("master must be True (a SAN NIC is a bus master)")
        if not values["maximum_length"] > 0:
            problems.append("maximum_length must be positive, got {!r}".format(values["maximum_length"]))
        if not 0 <= values["version"] <= MAX_DESCRIPTION_VERSION:
            problems.append(f'version {values["version"]!r} is not 0..{MAX_DESCRIPTION_VERSION}')
        if problems:
            raise SanError(WsaError.WSAEINVAL, "get_dma_adapter: {}".format("; ".join(problems)))
        adapter = HostDmaAdapter(self, next(self._adapter_ids), values)
        self._adapters[adapter.id] = adapter
        return adapter

    def put_dma_adapter(self, adapter: Any) -> None:
        if not isinstance(adapter, HostDmaAdapter) or self._adapters.get(adapter.id) is not adapter:
            raise SanError(WsaError.WSAEINVAL, f"put_dma_adapter: {adapter!r} is not a live adapter of {self.name}")
        if adapter.common_buffers:
            raise SanError(WsaError.WSAEINVAL, f"put_dma_adapter: DMA adapter #{adapter.id} still has "
                           f"{adapter.common_buffers} common buffer(s); free them first")
        del self._adapters[adapter.id]
        adapter.put = True

    # -- books ----------------------------------------------------------------------------------

    def live_allocations(self) -> int:
        return len(self._allocations) + len(self._contiguous) + len(self._common) + len(self._adapters)

    def leaks(self) -> list[str]:
        out = [f"allocation {a!r}" for a in self._allocations.values()]
        out += [f"contiguous block of {b.nbytes} bytes at {base:#x}" for base, (b, _) in self._contiguous.items()]
        out += [f"common buffer at logical {lg:#x}" for lg in self._common]
        out += [f"DMA adapter #{i}" for i in self._adapters]
        return out

    def reset(self) -> None:
        """Free everything (after a leak was reported)."""
        for allocation in list(self._allocations.values()):
            self.free(allocation)
        for base, (block, virtual) in list(self._contiguous.items()):
            del self._contiguous[base]
            self._release_block(virtual, block.size)
        for adapter in list(self._adapters.values()):
            for logical, (_length, virtual, _cache) in list(adapter._buffers.items()):
                del adapter._buffers[logical]
                self._release_block(virtual, self._common.pop(logical))
            del self._adapters[adapter.id]
            adapter.put = True

    close = reset


def host_capabilities(proxy: PinnedProxy, hello: dict[str, Any] | None = None) -> frozenset[str]:
    """Capabilities to declare for a host: "verbs", "rdma_read"; "memory_windows" when its children
    bind type-2 windows; plus what the proxy really gives. Never "nolowmem" nor "faults"."""
    caps = {"verbs", "rdma_read"}
    if hello is not None and hello.get("mw_mode") == "mw2":
        caps.add("memory_windows")
    caps |= proxy.capabilities()
    if "contiguous" in caps:
        caps.add("dma_adapter")  # common buffers come from the same hugetlb pages
    return frozenset(caps)
