"""The fuzz of tests/support/fuzz_spi.py on the emulator, with its internal books checked after every step too."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pytest_san.spi.emulator import EmulatorBackend
from tests.support.fuzz_spi import run_fuzz


def emulator_internals_agree(backend: Any) -> None:
    """Every registration's in-use count is the number of pending operations using it; no mapping resized."""
    for node in backend.nodes:
        for sock in node.base_provider.sockets:
            users = Counter(id(reg) for op in sock.pending() for reg in op.regs)
            for reg in (*sock.handles.values(), *sock.windows.values()):
                assert reg.in_use == users[id(reg)], f"{reg!r} on {sock!r}: in_use {reg.in_use}, {users[id(reg)]} users"
                assert reg.in_use >= 0 and reg.refs >= 1, reg
        for process in node.processes:
            for base, mem in process._maps.items():
                sizes = backend.__dict__.setdefault("_fuzz_sizes", {})
                assert sizes.setdefault((process.pid, base), len(mem)) == len(mem), f"mapping {base:#x} resized"


def test_fuzz_emulator() -> None:
    run_fuzz(EmulatorBackend, max_examples=150, steps=50, extra_check=emulator_internals_agree)
