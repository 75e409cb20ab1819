"""The proxy driver module (hil/kmod/san_proxy.c) through its binding (hil/agent/engines/verbs/proxy_module.py).

The device tests need /dev/san_proxy, as root: in a lab guest after ``insmod san_proxy.ko``. Without it they
are SKIPPED with the reason; ``SAN_REQUIRE_PROXY_MODULE=1`` turns that into an error (CI runs them so, in a
guest). They check the module against the kernel's own books: /proc/self/pagemap, VmPin, /proc/vmstat's
FOLL_PIN counts, /proc/zoneinfo and vm.lowmem_reserve_ratio. The NOLOWMEM checks mean most in a guest whose
memory is mostly above 4 GiB (qemu ``-machine max-ram-below-4g=256M``). The module's counts are module-wide: the
tests compare them with what was held before each test, so nothing else may use the device while they run.

The header check (the binding's layouts and ioctl numbers against san_proxy.h compiled by gcc) runs anywhere.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from hil.agent.engines.verbs import proxy_module as pm
from hil.agent.engines.verbs.libc import MAP_FAILED, libc, map_anonymous

ROOT = Path(__file__).resolve().parents[3]
HEADER = ROOT / "hil" / "kmod" / "san_proxy.h"
PAGE = pm.PAGE_SIZE
GIB4 = 1 << 32
U64 = (1 << 64) - 1
RATIO = "/proc/sys/vm/lowmem_reserve_ratio"
CACHES = (pm.NON_CACHED, pm.CACHED, pm.WRITE_COMBINED)


def _skip_reason() -> str | None:
    if not os.path.exists(pm.DEVICE):
        return f"the san_proxy module is not loaded: {pm.DEVICE} is absent (insmod san_proxy.ko in a lab guest)"
    if os.geteuid() != 0:
        return "the proxy module's tests run as root (the device is 0600; pagemap frames need CAP_SYS_ADMIN)"
    return None


SKIP = _skip_reason()
if SKIP is not None and os.environ.get("SAN_REQUIRE_PROXY_MODULE"):  # CI in a lab guest: a skip would hide a failure
    raise RuntimeError(f"SAN_REQUIRE_PROXY_MODULE is set but the proxy module tests cannot run: {SKIP}")
module = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


# ---- the kernel's books ----------------------------------------------------------------------------

def frames(address: int, pages: int) -> list[int]:
    """The page frames of this process's pages from /proc/self/pagemap (0: not present)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(address // PAGE * 8)
        data = f.read(8 * pages)
    entries = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
    return [e & ((1 << 55) - 1) if e >> 63 else 0 for e in entries]


def runs_of(frame_list: list[int], offset: int, length: int) -> tuple[tuple[int, int], ...]:
    """Physically contiguous runs covering ``length`` bytes from ``offset`` into the first frame."""
    runs: list[list[int]] = []
    for i, frame in enumerate(frame_list):
        skip = offset if i == 0 else 0
        start, take = frame * PAGE + skip, min(length, PAGE - skip)
        length -= take
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1][1] += take
        else:
            runs.append([start, take])
    return tuple((a, n) for a, n in runs)


def pages_of(runs: tuple[tuple[int, int], ...]) -> list[int]:
    """The frames of whole-page runs, in order."""
    return [(address + i) // PAGE for address, length in runs for i in range(0, length, PAGE)]


def vm_pin_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmPin:"))


def foll_pins() -> int:
    """FOLL_PIN pins held system-wide: nr_foll_pin_acquired - nr_foll_pin_released (per-CPU deltas folded first:
    /proc/vmstat alone lags by up to the counters' thresholds)."""
    with open("/proc/sys/vm/stat_refresh", "w") as f:
        f.write("1\n")
    with open("/proc/vmstat") as f:
        values = dict(line.split() for line in f)
    return int(values["nr_foll_pin_acquired"]) - int(values["nr_foll_pin_released"])


def ratio_text() -> str:
    with open(RATIO) as f:
        return f.read()


class Zone(NamedTuple):
    position: int  # its place in the node's zone list, and so in every zone's protection array
    managed: int  # pages
    protection: tuple[int, ...]  # pages it keeps free against allocations whose highest zone is each zone


def zones() -> dict[str, Zone]:
    """Node 0's zones from /proc/zoneinfo, by name."""
    with open("/proc/zoneinfo") as f:
        text = f.read()
    found: dict[str, Zone] = {}
    for section in re.split(r"^Node ", text, flags=re.M)[1:]:
        head = re.match(r"(\d+), zone\s+(\S+)", section)
        if head is None or head.group(1) != "0":
            continue
        managed = re.search(r"^\s+managed\s+(\d+)", section, re.M)
        protection = re.search(r"protection: \(([^)]*)\)", section)
        found[head.group(2)] = Zone(len(found), int(managed.group(1)) if managed else 0,
                                    tuple(int(v) for v in protection.group(1).split(",")) if protection else ())
    return found


def expect_errno(code: int, call: object, *args: object, **kwargs: object) -> OSError:
    assert callable(call)
    with pytest.raises(OSError) as caught:
        call(*args, **kwargs)
    assert caught.value.errno == code, caught.value
    return caught.value


def free_contiguous(proxy: pm.ProxyDevice, block: tuple[int, int], length: int, cache: int) -> None:
    proxy.free(block[0], pm.KIND_CONTIGUOUS, block[1], length, cache)


# ---- fixtures ------------------------------------------------------------------------------------

@pytest.fixture
def proxy() -> Iterator[pm.ProxyDevice]:
    device = pm.ProxyDevice()
    try:
        yield device
    finally:
        device.close()


@pytest.fixture
def anonymous() -> Iterator[tuple[int, int]]:
    """16 touched pages of private anonymous memory: (address, size)."""
    size = 16 * PAGE
    address = map_anonymous(size)
    assert address is not None, os.strerror(ctypes.get_errno())
    ctypes.memset(address, 0x5A, size)
    yield address, size
    libc.munmap(address, size)


@pytest.fixture
def pat(proxy: pm.ProxyDevice) -> bool:
    """Whether cache types are real here (the CPU's PAT is on): the cache assertions are made only then."""
    return proxy.info().pat


# ---- the header against the binding (anywhere with gcc) --------------------------------------------

def test_binding_matches_the_header(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None or not os.path.exists("/usr/include/linux/types.h"):
        pytest.skip("needs gcc and the kernel's user-space headers (/usr/include/linux/types.h)")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "san_proxy.h"', "int main(void) {"]
    for name, layout in pm.LAYOUTS.items():
        lines.append(f'printf("size {name} %zu\\n", sizeof(struct {name}));')
        lines += [f'printf("offset {name}.{field} %zu\\n", offsetof(struct {name}, {field}));'
                  for field, _ in layout.fields]
    lines += [f'printf("ioctl {name} %lu\\n", (unsigned long){name});' for name in pm.IOCTLS]
    constants = {"SAN_PROXY_ABI": pm.ABI, "SAN_PROXY_MAGIC": pm.MAGIC, "SAN_PROXY_DO_DIRECT_IO": pm.DO_DIRECT_IO,
                 "SAN_PROXY_NON_CACHED": pm.NON_CACHED, "SAN_PROXY_CACHED": pm.CACHED,
                 "SAN_PROXY_WRITE_COMBINED": pm.WRITE_COMBINED, "SAN_PROXY_CACHE_OTHER": pm.CACHE_OTHER,
                 "SAN_PROXY_KIND_PIN": pm.KIND_PIN, "SAN_PROXY_KIND_ALLOCATION": pm.KIND_ALLOCATION,
                 "SAN_PROXY_KIND_CONTIGUOUS": pm.KIND_CONTIGUOUS, "SAN_PROXY_KIND_ADAPTER": pm.KIND_ADAPTER,
                 "SAN_PROXY_KIND_COMMON": pm.KIND_COMMON, "SAN_PROXY_PTE_PRESENT": pm.PTE_PRESENT,
                 "SAN_PROXY_PTE_CACHE_SHIFT": pm.PTE_CACHE_SHIFT, "SAN_PROXY_PTE_PFN_MASK": pm.PTE_PFN_MASK}
    lines += [f'printf("constant {name} %llu\\n", (unsigned long long)({name}));' for name in constants]
    lines += ['printf("name device %s\\n", SAN_PROXY_NAME);', "return 0; }"]
    source = tmp_path / "layouts.c"
    source.write_text("\n".join(lines) + "\n")
    program = tmp_path / "layouts"
    built = subprocess.run([gcc, "-Wall", "-Werror", "-I", str(HEADER.parent), "-o", str(program), str(source)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    output = subprocess.run([str(program)], capture_output=True, text=True, check=True, timeout=60).stdout
    seen = {" ".join(line.split()[:2]): line.split()[2] for line in output.splitlines()}
    for name, layout in pm.LAYOUTS.items():
        assert int(seen[f"size {name}"]) == layout.size, name
        for field, _ in layout.fields:
            assert int(seen[f"offset {name}.{field}"]) == layout.offsets[field], f"{name}.{field}"
    for name, number in pm.IOCTLS.items():
        assert int(seen[f"ioctl {name}"]) == number, name
    for name, value in constants.items():
        assert int(seen[f"constant {name}"]) == value, name
    assert f"/dev/{seen['name device']}" == pm.DEVICE


# ---- INFO, PIN ------------------------------------------------------------------------------------

@module
def test_info(proxy: pm.ProxyDevice) -> None:
    info = proxy.info()
    assert info.abi == pm.ABI
    assert info.device_flags == pm.DO_DIRECT_IO  # P1
    assert info.page_size == PAGE
    assert info.max_contiguous >= PAGE and info.max_contiguous & (info.max_contiguous - 1) == 0
    assert info.nolowmem is (pm.live_counts()["nolowmem"] > 0)
    assert pm.live_counts()["files"] >= 1


@module
def test_open_fails_naming_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "san_proxy")
    error = expect_errno(errno.ENOENT, pm.ProxyDevice, missing)
    assert missing in str(error)


@module
def test_pin_frames_are_the_pages_and_stay_through_compaction(
        proxy: pm.ProxyDevice, anonymous: tuple[int, int]) -> None:
    address, size = anonymous
    start, length = address + 100, size - 200  # unaligned at both ends: 16 pages
    pins, vm_pin, live = foll_pins(), vm_pin_kib(), pm.live_counts()
    id, pages = proxy.pin(start, length)
    assert pages == 16
    assert vm_pin_kib() == vm_pin + pages * PAGE // 1024
    assert foll_pins() >= pins + pages
    now = pm.live_counts()
    assert (now["pins"], now["pinned_pages"]) == (live["pins"] + 1, live["pinned_pages"] + pages)
    before = frames(address, pages)
    assert all(before)
    query = proxy.query(id)
    assert (query.kind, query.length, query.cache_type, query.kernel_cache) == (
        pm.KIND_PIN, length, pm.CACHED, pm.CACHED)
    assert query.runs == runs_of(before, 100, length)
    assert sum(n for _, n in query.runs) == length
    with open("/proc/sys/vm/compact_memory", "w") as f:
        f.write("1\n")
    assert frames(address, pages) == before  # FOLL_LONGTERM: compaction did not move them
    assert proxy.query(id).runs == query.runs
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_PIN, 0, length, 0)  # a pin names no memory
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_ALLOCATION)
    expect_errno(errno.EINVAL, proxy.map, id, size)  # pins cannot be mapped
    proxy.free(id, pm.KIND_PIN)
    assert vm_pin_kib() == vm_pin
    assert foll_pins() == pins
    assert pm.live_counts() == live
    expect_errno(errno.EINVAL, proxy.query, id)


@module
def test_pin_refuses_what_is_not_wholly_mapped_and_writable(
        proxy: pm.ProxyDevice, anonymous: tuple[int, int]) -> None:
    address, size = anonymous
    vm_pin, pins = vm_pin_kib(), foll_pins()
    expect_errno(errno.EINVAL, proxy.pin, address, 0)
    libc.munmap(address + 8 * PAGE, PAGE)  # a hole in the middle
    error = expect_errno(errno.EFAULT, proxy.pin, address, size)
    assert "SAN_PROXY_PIN(address=" in str(error)
    libc.mprotect(address, PAGE, 1)  # read-only: FOLL_WRITE refuses it
    expect_errno(errno.EFAULT, proxy.pin, address, PAGE)
    expect_errno(errno.EFAULT, proxy.pin, U64 - PAGE, 2 * PAGE)  # wraps
    assert (vm_pin_kib(), foll_pins()) == (vm_pin, pins)


# ---- ALLOCATE, mapping ---------------------------------------------------------------------------

@module
def test_allocation_pages_mapped_and_freed(proxy: pm.ProxyDevice, pat: bool) -> None:
    live = pm.live_counts()
    length = 5 * PAGE + 7
    id, pages = proxy.allocate(length)
    assert pages == 6
    now = pm.live_counts()
    assert (now["allocations"], now["allocated_pages"]) == (live["allocations"] + 1, live["allocated_pages"] + 6)
    query = proxy.query(id)
    assert (query.kind, query.length, query.cache_type) == (pm.KIND_ALLOCATION, length, pm.CACHED)
    assert all(a % PAGE == 0 and n % PAGE == 0 for a, n in query.runs)
    assert sum(n for _, n in query.runs) == 6 * PAGE
    if pat:
        assert query.kernel_cache == pm.CACHED
    expect_errno(errno.EINVAL, proxy.map, id, 2 * PAGE)  # the whole object or nothing
    address = proxy.map(id, length)
    assert ctypes.string_at(address, 6 * PAGE) == bytes(6 * PAGE)  # zeroed
    ctypes.memset(address, 0xA5, 6 * PAGE)
    ptes = proxy.ptes(address, 6)
    assert [p.pfn for p in ptes] == pages_of(query.runs)
    assert all(p.present for p in ptes)
    if pat:
        assert {p.cache_type for p in ptes} == {pm.CACHED}
    expect_errno(errno.EBUSY, proxy.free, id, pm.KIND_ALLOCATION)
    expect_errno(errno.EINVAL, proxy.ptes, address, 7)  # past the mapping
    expect_errno(errno.EINVAL, proxy.ptes, address, 0)
    expect_errno(errno.EINVAL, proxy.ptes, address + 1, 1)
    proxy.unmap(address, length)
    expect_errno(errno.EINVAL, proxy.ptes, address, 1)  # no longer a mapping of the device
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_ALLOCATION, 0, length, 0)
    proxy.free(id, pm.KIND_ALLOCATION)
    assert pm.live_counts() == live
    expect_errno(errno.EINVAL, proxy.allocate, 0)
    expect_errno(errno.ENOMEM, proxy.allocate, 1 << 60)


@module
def test_mappings_counted_through_splits_and_forks(proxy: pm.ProxyDevice) -> None:
    id, _ = proxy.allocate(4 * PAGE)
    address = proxy.map(id, 4 * PAGE)
    libc.munmap(address + PAGE, PAGE)  # two mappings now
    proxy.unmap(address, PAGE)
    expect_errno(errno.EBUSY, proxy.free, id, pm.KIND_ALLOCATION)  # the other part is still mapped
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child inherits the shared mapping: it holds it until it exits
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        proxy.unmap(address + 2 * PAGE, 2 * PAGE)
        expect_errno(errno.EBUSY, proxy.free, id, pm.KIND_ALLOCATION)
    finally:
        os.close(write)
        os.waitpid(child, 0)
    proxy.free(id, pm.KIND_ALLOCATION)
    private = libc.mmap(None, PAGE, 3, 2, proxy.fileno(), proxy.allocate(PAGE)[0] * PAGE)  # MAP_PRIVATE
    assert private in (None, MAP_FAILED) and ctypes.get_errno() == errno.EINVAL


@module
def test_objects_belong_to_their_file(proxy: pm.ProxyDevice) -> None:
    id, _ = proxy.allocate(PAGE)
    with pm.ProxyDevice() as other:
        expect_errno(errno.EINVAL, other.query, id)
        expect_errno(errno.EINVAL, other.free, id, pm.KIND_ALLOCATION)
        expect_errno(errno.EINVAL, other.map, id, PAGE)
    proxy.free(id, pm.KIND_ALLOCATION)
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_ALLOCATION)
    expect_errno(errno.EINVAL, proxy.free, 0, pm.KIND_ALLOCATION)
    expect_errno(errno.EINVAL, proxy.query, 12345)


# ---- ALLOCATE_CONTIGUOUS -------------------------------------------------------------------------

@module
@pytest.mark.parametrize("cache", CACHES, ids=["non_cached", "cached", "write_combined"])
def test_contiguous_block_in_range_of_its_cache_type(proxy: pm.ProxyDevice, pat: bool, cache: int) -> None:
    live = pm.live_counts()
    length, lowest, highest, boundary = 3 * PAGE - 5, 1 << 20, GIB4 - 1, 1 << 16
    block = proxy.allocate_contiguous(length, lowest, highest, boundary, cache)
    assert block is not None
    id, base = block
    assert base % PAGE == 0 and lowest <= base and base + length - 1 <= highest
    assert base // boundary == (base + length - 1) // boundary
    query = proxy.query(id)
    assert (query.kind, query.length, query.cache_type) == (pm.KIND_CONTIGUOUS, length, cache)
    assert query.runs == ((base, 3 * PAGE),)
    if pat:
        assert query.kernel_cache == cache
    address = proxy.map(id, length)
    ptes = proxy.ptes(address, 3)
    assert [p.pfn for p in ptes] == [base // PAGE + i for i in range(3)]
    if pat:
        assert {p.cache_type for p in ptes} == {cache}
    ctypes.memset(address, 0x3C, 3 * PAGE)
    assert ctypes.string_at(address + PAGE, 4) == b"\x3c" * 4
    expect_errno(errno.EBUSY, proxy.free, id, pm.KIND_CONTIGUOUS, base, length, cache)
    proxy.unmap(address, length)
    for wrong in ((base + PAGE, length, cache), (base, 3 * PAGE, cache), (base, length, (cache + 1) % 3),
                  (0, 0, 0)):
        expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_CONTIGUOUS, *wrong)
        assert proxy.query(id).runs == query.runs  # still there
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_COMMON, base, length, cache)
    proxy.free(id, pm.KIND_CONTIGUOUS, base, length, cache)
    assert pm.live_counts() == live


@module
def test_contiguous_none_when_impossible(proxy: pm.ProxyDevice) -> None:
    live = pm.live_counts()
    largest = proxy.info().max_contiguous
    for length, lowest, highest, boundary in (
            (PAGE, 1 << 30, (1 << 30) - 1, 0),          # lowest > highest
            (3 * PAGE, 0, 2 * PAGE - 1, 0),               # longer than the range
            (3 * PAGE, 0, U64, 2 * PAGE),                 # longer than the boundary
            (largest + PAGE, 0, U64, 0),                  # larger than any buddy block
            (PAGE, 0, 0xFFFF, 0)):                        # the first 64 KiB: the kernel keeps them
        assert proxy.allocate_contiguous(length, lowest, highest, boundary, pm.CACHED) is None, (length, highest)
    assert pm.live_counts() == live  # the blocks tried and rejected were given back
    expect_errno(errno.EINVAL, proxy.allocate_contiguous, 0, 0, U64, 0, pm.CACHED)
    expect_errno(errno.EINVAL, proxy.allocate_contiguous, PAGE, 0, U64, 0, pm.CACHE_OTHER)
    expect_errno(errno.EINVAL, proxy.allocate_contiguous, PAGE, 0, U64, PAGE + 1, pm.CACHED)


@module
def test_contiguous_largest_block(proxy: pm.ProxyDevice) -> None:
    largest = proxy.info().max_contiguous
    block = proxy.allocate_contiguous(largest, 0, U64, largest, pm.CACHED)
    if block is not None:  # memory may be too fragmented for one: then none, which P4 allows
        assert block[1] % largest == 0
        assert proxy.query(block[0]).runs == ((block[1], largest),)
        free_contiguous(proxy, block, largest, pm.CACHED)


# ---- GET_ADAPTER, ALLOCATE_COMMON ----------------------------------------------------------------

def adapter(proxy: pm.ProxyDevice, *, dma64: bool = False, maximum_length: int = 1 << 20,
            version: int = 2, master: bool = True) -> pm.Adapter:
    return proxy.get_adapter(version=version, master=master, scatter_gather=True, dma32=not dma64, dma64=dma64,
                             interface_type=5, maximum_length=maximum_length)


@module
def test_adapter_descriptions(proxy: pm.ProxyDevice) -> None:
    live = pm.live_counts()
    a32 = adapter(proxy, maximum_length=PAGE * 10 + 1)
    assert (a32.dma_mask, a32.map_registers) == (GIB4 - 1, 11)
    a64 = adapter(proxy, dma64=True, maximum_length=1)
    assert (a64.dma_mask, a64.map_registers) == (U64, 1)
    assert proxy.query(a32.id).kind == pm.KIND_ADAPTER
    expect_errno(errno.EINVAL, adapter, proxy, version=4)
    expect_errno(errno.EINVAL, adapter, proxy, master=False)
    expect_errno(errno.EINVAL, adapter, proxy, maximum_length=0)
    layout = pm.LAYOUTS["san_proxy_description"]
    for field, value in (("reserved", 1), ("scatter_gather", 2), ("dma64", 7)):  # left uninitialised
        values = dict.fromkeys((name for name, _ in layout.fields), 0)
        values.update(version=1, master=1, maximum_length=PAGE)
        values[field] = value
        raw = bytearray(layout.size)
        layout.struct.pack_into(raw, 0, *(v for name, code in layout.fields
                                          for v in ([values[name]] * (4 if code == "4Q" else 1))))
        with pytest.raises(OSError) as caught:
            fcntl.ioctl(proxy.fileno(), pm.IOCTLS["SAN_PROXY_GET_ADAPTER"], raw, True)
        assert caught.value.errno == errno.EINVAL, field
    expect_errno(errno.EINVAL, proxy.free, a32.id, pm.KIND_ADAPTER, 0, 1 << 20, 0)
    proxy.free(a32.id, pm.KIND_ADAPTER)
    proxy.free(a64.id, pm.KIND_ADAPTER)
    assert pm.live_counts() == live


@module
def test_common_buffers_of_a_32_bit_adapter(proxy: pm.ProxyDevice, pat: bool) -> None:
    live = pm.live_counts()
    a32 = adapter(proxy)
    buffers = []
    for cache_enabled in (False, True):
        length = 2 * PAGE + 1
        made = proxy.allocate_common(a32.id, length, cache_enabled)
        assert made is not None
        id, logical = made
        assert logical % PAGE == 0 and logical + length <= GIB4
        query = proxy.query(id)
        cache = pm.CACHED if cache_enabled else pm.NON_CACHED
        assert (query.kind, query.length, query.cache_type) == (pm.KIND_COMMON, length, cache)
        assert query.runs == ((logical, 3 * PAGE),)  # no IOMMU: the logical address is the physical one
        address = proxy.map(id, length)
        ptes = proxy.ptes(address, 3)
        assert [p.pfn for p in ptes] == [logical // PAGE + i for i in range(3)]
        if pat:
            assert query.kernel_cache == cache
            assert {p.cache_type for p in ptes} == {cache}
        expect_errno(errno.EBUSY, proxy.free, id, pm.KIND_COMMON, logical, length, cache)
        proxy.unmap(address, length)
        buffers.append((id, logical, length, cache))
    assert pm.live_counts()["common_buffers"] == live["common_buffers"] + 2
    expect_errno(errno.EBUSY, proxy.free, a32.id, pm.KIND_ADAPTER)  # put_dma_adapter too early
    id, logical, length, cache = buffers[0]
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_COMMON, logical + PAGE, length, cache)
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_COMMON, logical, length + 1, cache)
    expect_errno(errno.EINVAL, proxy.free, id, pm.KIND_COMMON, logical, length, 1 - cache)
    for id, logical, length, cache in buffers:
        proxy.free(id, pm.KIND_COMMON, logical, length, cache)
    proxy.free(a32.id, pm.KIND_ADAPTER)
    assert pm.live_counts() == live


@module
def test_common_buffer_errors(proxy: pm.ProxyDevice) -> None:
    a64 = adapter(proxy, dma64=True)
    allocation, _ = proxy.allocate(PAGE)
    expect_errno(errno.EINVAL, proxy.allocate_common, 999_999, PAGE, True)
    expect_errno(errno.EINVAL, proxy.allocate_common, allocation, PAGE, True)
    expect_errno(errno.EINVAL, proxy.allocate_common, a64.id, 0, True)
    assert proxy.allocate_common(a64.id, proxy.info().max_contiguous * 2, True) is None
    made = proxy.allocate_common(a64.id, PAGE, True)
    assert made is not None
    proxy.free(made[0], pm.KIND_COMMON, made[1], PAGE, pm.CACHED)
    proxy.free(a64.id, pm.KIND_ADAPTER)
    proxy.free(allocation, pm.KIND_ALLOCATION)


# ---- NOLOWMEM --------------------------------------------------------------------------------------

def dma32_protected() -> bool | None:
    """Whether DMA32 refuses every Normal allocation (protection >= its managed pages); None: no Normal zone."""
    found = zones()
    dma32, normal = found.get("DMA32"), found.get("Normal")
    if dma32 is None or normal is None or not normal.managed:
        return None
    return dma32.protection[normal.position] >= dma32.managed


@module
def test_nolowmem(proxy: pm.ProxyDevice) -> None:
    if pm.live_counts()["nolowmem"]:
        pytest.skip("another open file of the device holds NOLOWMEM: taking and restoring cannot be seen here")
    original = ratio_text()
    proxy.set_nolowmem(True)
    try:
        assert ratio_text().startswith("1\t1\t")
        assert proxy.info().nolowmem is True
        assert pm.live_counts()["nolowmem"] == 1
        assert dma32_protected() in (True, None)
        proxy.set_nolowmem(True)  # already held: nothing more
        with pm.ProxyDevice() as other:  # a second holder keeps it raised after the first leaves
            other.set_nolowmem(True)
            assert pm.live_counts()["nolowmem"] == 2
            proxy.set_nolowmem(False)
            assert ratio_text().startswith("1\t1\t")
            proxy.set_nolowmem(True)
        assert ratio_text().startswith("1\t1\t")  # the other file's close let go of its hold only
        # P3: low memory is still to be had for RDMA
        block = proxy.allocate_contiguous(2 * PAGE, 0, GIB4 - 1, 0, pm.CACHED)
        assert block is not None and block[1] + 2 * PAGE <= GIB4
        a32 = adapter(proxy)
        common = proxy.allocate_common(a32.id, PAGE, False)
        assert common is not None and common[1] + PAGE <= GIB4
        free_contiguous(proxy, block, 2 * PAGE, pm.CACHED)
        proxy.free(common[0], pm.KIND_COMMON, common[1], PAGE, pm.NON_CACHED)
        proxy.free(a32.id, pm.KIND_ADAPTER)
    finally:
        proxy.set_nolowmem(False)
    assert ratio_text() == original
    assert proxy.info().nolowmem is False
    assert pm.live_counts()["nolowmem"] == 0
    expect_errno(errno.EINVAL, proxy.set_nolowmem, False)


@module
def test_nolowmem_drained_memory_stays_above_4_gib(proxy: pm.ProxyDevice) -> None:
    if dma32_protected() is None:  # a layout question, not a missing module: skipped under SAN_REQUIRE_... too
        pytest.skip("no memory above 4 GiB here (qemu -machine max-ram-below-4g=256M makes some)")
    chunk, held = 8 << 20, []
    proxy.set_nolowmem(True)
    try:
        for _ in range(4096):  # bounded: stops at ENOMEM, the module keeps a margin free
            try:
                held.append(proxy.allocate(chunk)[0])
            except OSError as exc:
                assert exc.errno == errno.ENOMEM, exc
                break
        assert held, "not one allocation above 4 GiB"
        low = [(id, a) for id in held for a, _ in proxy.query(id).runs if a < GIB4]
        assert not low, f"allocations below 4 GiB under NOLOWMEM: {low[:5]}"
        # and low memory for RDMA is still there
        block = proxy.allocate_contiguous(PAGE, 0, GIB4 - 1, 0, pm.CACHED)
        assert block is not None
        free_contiguous(proxy, block, PAGE, pm.CACHED)
    finally:
        for id in held:
            proxy.free(id, pm.KIND_ALLOCATION)
        proxy.set_nolowmem(False)


# ---- a killed process leaves nothing --------------------------------------------------------------

CHILD = r"""
import ctypes, sys, time
sys.path.insert(0, sys.argv[1])
from hil.agent.engines.verbs import proxy_module as pm
from hil.agent.engines.verbs.libc import map_anonymous
page, low = pm.PAGE_SIZE, (1 << 32) - 1
dev = pm.ProxyDevice()
buffer = map_anonymous(32 * page)
ctypes.memset(buffer, 1, 32 * page)
dev.pin(buffer + 5, 31 * page)
allocation, _ = dev.allocate(16 * page)
blocks = [dev.allocate_contiguous(2 * page, 0, low, 0, cache) for cache in (0, 1, 2)]
adapter = dev.get_adapter(version=2, master=True, scatter_gather=True, dma32=True, dma64=False,
                          interface_type=5, maximum_length=1 << 20)
commons = [dev.allocate_common(adapter.id, page, enabled) for enabled in (False, True)]
dev.map(allocation, 16 * page)
dev.map(blocks[0][0], 2 * page)
dev.set_nolowmem(True)
print("ready", flush=True)
time.sleep(600)
"""


@module
def test_killed_process_leaves_nothing() -> None:
    """In a quiet guest every count is 0 before the child and after it (other holders are left alone)."""
    live, pins, ratio = pm.live_counts(), foll_pins(), ratio_text()
    if live["nolowmem"]:
        pytest.skip("another open file of the device holds NOLOWMEM: the child's hold could not be seen")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read() if child.stderr else line
        held = pm.live_counts()
        expected = {"files": 1, "pins": 1, "pinned_pages": 32, "allocations": 1, "allocated_pages": 16,
                    "contiguous": 3, "adapters": 1, "common_buffers": 2, "nolowmem": 1}
        assert {k: held[k] - live[k] for k in expected} == expected
        assert foll_pins() >= pins + 32
        assert ratio_text().startswith("1\t1\t")
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    deadline = time.monotonic() + 20  # the release runs in the child's exit; allow for a slow guest
    while pm.live_counts() != live and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pm.live_counts() == live
    assert foll_pins() == pins
    assert ratio_text() == ratio
