"""The verbs engine's kernel proxy (``KernelProxy`` over /dev/san_proxy) in a lab guest: the pins its processes
make, what the kernel's books of pins say of them (R12), NOLOWMEM given back at every reset.

It needs an RDMA device, pyverbs and the san_proxy module (a `san-hil lab up` guest has all three); without them
the tests are SKIPPED with the reason, or fail at once where ``SAN_REQUIRE_PROXY_MODULE=1`` says they must run (CI
runs them so in the first lab guest). The agent must not be running on the guest: these tests take NOLOWMEM and
count the module's objects.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.agent.engines.verbs import host
from hil.agent.engines.verbs.proxy_module import live_counts
from pytest_san.spi.contract import PAGE_SIZE, SanError, WsaError

RATIO = Path("/proc/sys/vm/lowmem_reserve_ratio")


def _skip_reason() -> str | None:
    if not os.path.exists("/dev/san_proxy"):
        return "no /dev/san_proxy: the san_proxy module is not loaded (san-hil lab up loads it)"
    if host.pyverbs_python() is None:
        return "pyverbs not importable"
    try:
        host.select_device(os.environ.get("SAN_DEVICE"))
    except host.NoRdmaDevice as exc:
        return str(exc)
    return None


SKIP = _skip_reason()
if SKIP is not None and os.environ.get("SAN_REQUIRE_PROXY_MODULE"):
    raise RuntimeError(f"SAN_REQUIRE_PROXY_MODULE is set but the kernel proxy tests cannot run: {SKIP}")
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    from hil.agent.engines.verbs.engine import VerbsEngine

    python = host.pyverbs_python()
    assert python is not None
    monkeypatch.setattr(sys, "executable", python)  # the children need the interpreter that has pyverbs
    device, port = host.select_device(os.environ.get("SAN_DEVICE"))
    made = VerbsEngine("lab", device, netdev=os.environ.get("SAN_NETDEV"), port=port)
    try:
        yield made
    finally:
        made.close()
    assert live_counts()["pins"] == 0 and live_counts()["files"] == 0


def test_the_engine_drives_the_kernel_proxy(engine: object) -> None:
    from hil.agent.engines.verbs.engine import VerbsEngine
    from hil.agent.engines.verbs.kernel_proxy import KernelProxy

    assert isinstance(engine, VerbsEngine)
    assert isinstance(engine.proxy.inner, KernelProxy)
    hello = engine.hello()
    assert hello["proxy"]["kind"] == "kernel module" and hello["proxy"]["abi"] == 1
    assert {"direct_io", "contiguous", "dma_adapter", "physical_addresses"} <= set(hello["capabilities"])


def test_a_pin_the_proxy_forgot_is_an_r12_finding_naming_its_pages(engine: object) -> None:
    """A planted proxy bug: a pin made, then dropped from the proxy's books while the kernel still holds it. The
    books' leak check cannot see it; the kernel's books of pins (VmPin) do, as a "pin" leak naming the process."""
    from hil.agent.engines.verbs.engine import VerbsEngine

    assert isinstance(engine, VerbsEngine)
    process = engine.default_process
    buf = process.alloc(3 * PAGE_SIZE)
    pin = engine.proxy.pin(buf)
    assert engine.leaks() == [[engine.host, "allocation", f"pin {pin!r}"]]  # the books see it while they have it
    engine.proxy.inner._pins.clear()  # the bug
    found = engine.leaks()
    pins = [text for host_name, kind, text in found if kind == "pin"]
    assert len(pins) == 1 and f"pid {process.pid} (default) has 3 page(s) pinned" in pins[0], found
    process.child.call("proxy_unpin", pin_id=pin.id)
    assert [f for f in engine.leaks() if f[1] == "pin"] == []


def test_pins_end_with_their_process_in_the_kernel_too(engine: object) -> None:
    from hil.agent.engines.verbs.engine import VerbsEngine

    assert isinstance(engine, VerbsEngine)
    process = engine.spawn()
    engine.proxy.pin(process.alloc(2 * PAGE_SIZE))
    assert live_counts()["pins"] == 1
    process.kill()
    assert engine.proxy.live_allocations() == 0
    assert live_counts()["pins"] == 0
    assert engine.leaks() == []


def test_nolowmem_is_given_back_at_every_reset(engine: object) -> None:
    from hil.agent.engines.verbs.engine import VerbsEngine

    assert isinstance(engine, VerbsEngine)
    before = RATIO.read_text()
    if "nolowmem" not in engine.proxy.capabilities():
        pytest.skip("this guest has no memory above 4 GiB (san-hil lab up --low-memory gives it some)")
    engine.proxy.set_nolowmem(True)
    assert RATIO.read_text().split()[:2] == ["1", "1"]
    engine.reset()
    assert not engine.proxy.nolowmem and RATIO.read_text() == before


def test_a_bad_pin_is_the_contracts_error(engine: object) -> None:
    from hil.agent.engines.verbs.engine import VerbsBuffer, VerbsEngine

    assert isinstance(engine, VerbsEngine)
    process = engine.default_process
    buf = process.alloc(PAGE_SIZE)
    for bad, code in ((VerbsBuffer(process, buf.address + 64 * PAGE_SIZE, PAGE_SIZE), WsaError.WSAEFAULT),
                      (VerbsBuffer(process, buf.address, -1), WsaError.WSAEINVAL),
                      (VerbsBuffer(process, buf.address, 0), WsaError.WSAEFAULT)):
        with pytest.raises(SanError) as err:
            engine.proxy.pin(bad)
        assert err.value.code is code
    assert engine.proxy.live_allocations() == 0 and live_counts()["pins"] == 0
