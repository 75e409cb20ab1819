"""What the agent reads of a host's kernel beside the proxy module, tested without a guest: NOLOWMEM in
/proc/zoneinfo, the books of pinned pages (VmPin, nr_foll_pin_*), the kernel log's oops lookout, and how the
module's errnos become the contract's codes. The module itself is tested in a guest (test_proxy_module.py,
test_kernel_proxy.py)."""

from __future__ import annotations

import errno
import os
import textwrap
import uuid
from pathlib import Path

import pytest

from hil.agent.engines.verbs.kernel_proxy import as_san_error, nolowmem_in_effect, zone_protection
from hil.agent.engines.verbs.pin_witness import PinWitness, foll_pins, pages_spanned, vm_pin_pages
from hil.agent.kmsg import KernelLogWatch, console_trouble, first_trouble
from pytest_san import PAGE_SIZE, WsaError

P = PAGE_SIZE


def zoneinfo(dma32_protection: int, normal_managed: int = 196608, dma_protection: int | None = None) -> str:
    """/proc/zoneinfo of a 1 GiB guest with 256 MiB below 4 GiB (the lab's NOLOWMEM layout)."""
    dma = dma_protection if dma_protection is not None else dma32_protection
    return textwrap.dedent(f"""\
        Node 0, zone      DMA
          pages free     3000
                managed  3840
                protection: (0, 60000, {dma}, {dma}, {dma})
        Node 0, zone    DMA32
          pages free     50000
                managed  60000
                protection: (0, 0, {dma32_protection}, {dma32_protection}, {dma32_protection})
        Node 0, zone   Normal
          pages free     150000
                managed  {normal_managed}
                protection: (0, 0, 0, 0, 0)
        Node 0, zone  Movable
          pages free     0
                managed  0
                protection: (0, 0, 0, 0, 0)
        """)


def test_zoneinfo_is_read_per_zone() -> None:
    zones = zone_protection(zoneinfo(196608))
    assert list(zones) == ["DMA", "DMA32", "Normal", "Movable"]
    assert zones["DMA32"] == (60000, [0, 0, 196608, 196608, 196608])


def test_nolowmem_shows_only_with_memory_above_4_gib_and_the_low_zones_protected() -> None:
    assert nolowmem_in_effect(zoneinfo(196608))  # the reserve ratio 1: all of Normal's pages
    assert not nolowmem_in_effect(zoneinfo(768))  # the default ratio 256: low memory still a fallback
    assert not nolowmem_in_effect(zoneinfo(196608, dma_protection=10))  # DMA still a fallback
    assert not nolowmem_in_effect(zoneinfo(0, normal_managed=0))  # all memory below 4 GiB: nothing to keep to
    assert not nolowmem_in_effect("")


def test_this_hosts_zoneinfo_reads() -> None:
    text = Path("/proc/zoneinfo").read_text()
    zones = zone_protection(text)
    assert "DMA32" in zones or "Normal" in zones


@pytest.mark.parametrize(("code", "wsa"), [(errno.EINVAL, WsaError.WSAEINVAL), (errno.EFAULT, WsaError.WSAEFAULT),
                                           (errno.ENOMEM, WsaError.WSAENOBUFS), (errno.EBUSY, WsaError.WSAEINVAL),
                                           (errno.ENOENT, WsaError.WSAEOPNOTSUPP), (errno.EIO, WsaError.WSAEINVAL)])
def test_a_module_errno_is_the_contracts_code(code: int, wsa: WsaError) -> None:
    error = as_san_error(OSError(code, os.strerror(code), "SAN_PROXY_PIN(address=0x1000)"), "pin on lab1")
    assert error.code is wsa
    assert "pin on lab1" in str(error) and os.strerror(code) in str(error)


def test_pages_spanned_counts_every_page_a_range_touches() -> None:
    assert pages_spanned(0, P) == 1 and pages_spanned(1, P) == 2 and pages_spanned(P - 1, 2) == 2
    assert pages_spanned(5 * P, 0) == 0 and pages_spanned(0, 3 * P + 1) == 4


class Books:
    """A host's pinned pages as the pin witness reads them: per pid, and the machine's total."""

    def __init__(self) -> None:
        self.vm_pin: dict[int, int] = {}
        self.machine = 100  # pins of the host's own, before the agent

    def witness(self) -> PinWitness:
        return PinWitness(lambda pid: self.vm_pin.get(pid), lambda: self.machine)


def test_pins_that_match_the_books_are_no_finding() -> None:
    books = Books()
    witness = books.witness()
    books.vm_pin = {7: 5, 8: 0}
    books.machine += 5
    pinned, findings = witness.read([{"pid": 7, "vm_pin_pages": 5, "vm_pin_base": 0},
                                     {"pid": 8, "vm_pin_pages": 0, "vm_pin_base": 0}])
    assert findings == [] and pinned == {"7": 5, "8": 0}


def test_a_pin_nothing_declares_is_a_finding_naming_the_process_and_pages() -> None:
    books = Books()
    witness = books.witness()
    books.vm_pin = {7: 3}
    books.machine += 3
    _, findings = witness.read([{"pid": 7, "role": "default", "vm_pin_pages": 1, "vm_pin_base": 0}])
    assert findings == [f"pid 7 (default) has 2 page(s) pinned (VmPin {3 * P >> 10} kB) that none of its "
                        "registrations or proxy pins explains: a pin outlived what needed it"]


def test_a_registration_that_pins_nothing_is_a_finding() -> None:
    books = Books()
    witness = books.witness()
    books.vm_pin = {7: 1}
    books.machine += 1
    _, findings = witness.read([{"pid": 7, "vm_pin_pages": 4, "vm_pin_base": 0}])
    assert findings and "3 page(s) fewer pinned than its registrations" in findings[0]


def test_pins_the_machine_holds_beyond_the_agents_processes_are_a_finding() -> None:
    books = Books()
    witness = books.witness()
    books.vm_pin = {7: 2, 9: 4}
    books.machine += 2 + 4 + 8  # 8 pages of a process that ended, never unpinned
    _, findings = witness.read([{"pid": 7, "vm_pin_pages": 2, "vm_pin_base": 0}], others=[9])
    assert findings == ["the machine holds 14 long-term pinned page(s) more than when the agent started "
                        "(nr_foll_pin_acquired - nr_foll_pin_released), where the agent's processes account for 6"]


def test_a_pin_released_a_moment_late_is_no_finding() -> None:
    books = Books()
    witness = books.witness()
    books.vm_pin = {7: 2}
    books.machine += 2
    looks = iter([2, 0])

    def lagging(pid: int) -> int:
        now = next(looks, 0)
        books.machine = 100 + now
        return now

    witness._vm_pin = lagging
    _, findings = witness.read([{"pid": 7, "vm_pin_pages": 0, "vm_pin_base": 0}])
    assert findings == []


def test_this_hosts_books_of_pins_read() -> None:
    assert vm_pin_pages(os.getpid()) is not None
    assert vm_pin_pages(2 ** 22 + 12345) is None  # no such process
    assert foll_pins() is not None or not Path("/proc/vmstat").read_text().count("nr_foll_pin")


def test_the_first_trouble_in_the_log_is_its_first_lines() -> None:
    log = ["rxe0: added", "BUG: unable to handle page fault for address: 0000000000001000", "#PF: supervisor",
           *[f"line {i}" for i in range(20)], "WARNING: CPU: 0 PID: 1 at later"]
    trouble = first_trouble(log)
    assert trouble[0].startswith("BUG: unable to handle page fault") and len(trouble) == 12
    assert first_trouble(["WARNING: CPU: 0 PID: 12 at mm/gup.c:123 foo"]) == \
        ["WARNING: CPU: 0 PID: 12 at mm/gup.c:123 foo"]
    assert first_trouble(["Kernel panic - not syncing: Fatal exception"])
    assert first_trouble(["watchdog: BUG: soft lockup - CPU#0 stuck for 22s!"])
    assert first_trouble(["x86/PAT: reserve_ram_pages_type failed", "alloc_contig_range: [1000, 1001) PFNs busy",
                          "san_proxy: loaded"]) == []


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="/dev/kmsg needs root")
def test_the_watch_reads_what_the_kernel_logged_since_it_started() -> None:
    marker = f"pytest-san kmsg test {uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<6>{marker}: before\n")
    watch = KernelLogWatch()
    try:
        assert watch.unavailable is None
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<6>{marker}: after\n")
        seen = [m for m in watch.messages() if marker in m]
        assert seen == [f"{marker}: after"]
        assert watch.messages() == [] or all(marker not in m for m in watch.messages())
    finally:
        watch.close()


def test_a_watch_without_the_log_says_why(tmp_path: Path) -> None:
    watch = KernelLogWatch(str(tmp_path / "no-kmsg"))
    assert watch.unavailable is not None and "no-kmsg" in watch.unavailable
    assert watch.trouble() == []


def test_a_consoles_oops_is_read_without_its_time_stamps() -> None:
    console = ("[   26.189947] rdma_rxe: loaded\r\n"
               "[  301.000001] BUG: kernel NULL pointer dereference, address: 0000000000000008\r\n"
               "[  301.000002] #PF: supervisor read access in kernel mode\r\n"
               "[  301.000003] RIP: 0010:san_free+0x12/0x80 [san_proxy]\r\n"
               "[  301.1] Kernel panic - not syncing: Fatal exception\r\n")
    trouble = console_trouble(console)
    assert trouble[0] == "BUG: kernel NULL pointer dereference, address: 0000000000000008"
    assert trouble[2] == "RIP: 0010:san_free+0x12/0x80 [san_proxy]" and len(trouble) == 4
    assert console_trouble("[    1.0] Linux version 6.12\nSAN-LAB-READY lab1 netdev=eth1\n") == []
