"""The emulator's model of the frames behind process pages (DO_DIRECT_IO, P1): faulted in when first asked, held
by pins, moved by compaction unless pinned, given back when the process ends."""

from __future__ import annotations

import pytest

from pytest_san import FOUR_GIB, PAGE_SIZE, SanError, WsaError
from pytest_san.spi.emulator import EmulatorBackend
from pytest_san.spi.emulator.memory import PhysicalMemory
from pytest_san.spi.emulator.paging import runs
from pytest_san.spi.emulator.proxy import EmulatedProxy

P = PAGE_SIZE


@pytest.fixture
def backend() -> EmulatorBackend:
    return EmulatorBackend(2)


def test_runs_cover_exactly_the_bytes_and_join_neighbouring_frames() -> None:
    assert runs([5, 6, 9], 0x1000 + 17, 2 * P) == ((5 * P + 17, 2 * P - 17), (9 * P, 17))
    assert runs([3], 0x2000, 10) == ((3 * P, 10),)


def test_compaction_moves_what_no_pin_holds(backend: EmulatorBackend) -> None:
    node = backend.nodes[0]
    proxy = node.base_proxy
    held, loose = node.default_process.alloc(3 * P), node.default_process.alloc(3 * P)
    pin = proxy.pin(held)
    where_held, where_loose = proxy.physical_runs(held), proxy.physical_runs(loose)
    assert where_held == pin.physical_runs
    proxy.compact_memory()
    assert proxy.physical_runs(held) == where_held
    assert proxy.physical_runs(loose) != where_loose, "an unpinned page did not move"
    proxy.free(pin)
    proxy.compact_memory()
    assert proxy.physical_runs(held) != where_held, "a page stayed pinned after its pin was freed"


def test_two_pins_of_a_page_hold_it_until_both_are_freed(backend: EmulatorBackend) -> None:
    node = backend.nodes[0]
    proxy = node.base_proxy
    buf = node.default_process.alloc(P)
    first, second = proxy.pin(buf), proxy.pin(buf)
    assert first.physical_runs == second.physical_runs
    proxy.free(first)
    proxy.compact_memory()
    assert proxy.physical_runs(buf) == second.physical_runs
    proxy.free(second)
    assert proxy.live_allocations() == 0


def test_a_process_that_ends_gives_its_frames_and_pins_back(backend: EmulatorBackend) -> None:
    node = backend.nodes[0]
    proxy = node.base_proxy
    free_before = proxy.memory.free_frames
    process = node.spawn_process()
    pin = proxy.pin(process.alloc(4 * P))
    proxy.physical_runs(process.alloc(2 * P))
    assert proxy.memory.free_frames == free_before - 6
    process.kill()
    assert proxy.live_allocations() == 0
    with pytest.raises(SanError) as err:
        proxy.free(pin)
    assert err.value.code is WsaError.WSAEINVAL
    proxy.reset()
    assert proxy.memory.free_frames == free_before


def test_a_buffer_of_another_node_is_not_this_proxys_to_pin(backend: EmulatorBackend) -> None:
    other = backend.nodes[1].default_process.alloc(P)
    with pytest.raises(SanError) as err:
        backend.nodes[0].base_proxy.pin(other)
    assert err.value.code is WsaError.WSAEFAULT
    with pytest.raises(SanError) as err:
        backend.nodes[0].base_proxy.pin("a string")  # type: ignore[arg-type]
    assert err.value.code is WsaError.WSAEFAULT


def test_under_nolowmem_pages_fault_in_above_4_gib(backend: EmulatorBackend) -> None:
    node = backend.nodes[0]
    proxy = node.base_proxy
    proxy.set_nolowmem(True)
    try:
        assert all(address >= FOUR_GIB for address, _ in proxy.physical_runs(node.default_process.alloc(2 * P)))
    finally:
        proxy.set_nolowmem(False)


def test_no_frame_left_is_wsaenobufs_and_faults_nothing_in() -> None:
    proxy = EmulatedProxy("tiny", PhysicalMemory(frames=300, reserved=256))
    backend = EmulatorBackend(1, wrap_proxy=lambda node, base: base)
    node = backend.nodes[0]
    node.base_proxy = proxy
    proxy.node_name = node.name
    buf = node.default_process.alloc(64 * P)
    with pytest.raises(SanError) as err:
        proxy.pin(buf)
    assert err.value.code is WsaError.WSAENOBUFS
    assert proxy.memory.free_frames == 44 and proxy.live_allocations() == 0
