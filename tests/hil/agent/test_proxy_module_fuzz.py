"""The proxy module (/dev/san_proxy) against arbitrary arguments, as an adversary would call it: every ioctl with
every field drawn from edge values (0, 1, odd sizes, 2^63, all ones, unmapped and kernel addresses, ids that
were never handed out or were freed), mmap with arbitrary ids and lengths. Whatever comes in, the answer is a
result or an errno, never an oops, a warning or a leak: the kernel log stays clean and, once the file is
closed, the module holds nothing.

Runs in a lab guest with the module loaded (skipped elsewhere, or an error under SAN_REQUIRE_PROXY_MODULE=1);
``SAN_FUZZ_SEED`` replays a run (the seed is printed), ``SAN_FUZZ_CALLS`` sets its length.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
from collections.abc import Iterator

import pytest

from hil.agent.engines.verbs import proxy_module as pm
from hil.agent.kmsg import KernelLogWatch

SKIP = None if os.path.exists(pm.DEVICE) else f"no {pm.DEVICE}: the san_proxy module is not loaded"
if SKIP is not None and os.environ.get("SAN_REQUIRE_PROXY_MODULE"):
    raise RuntimeError(f"SAN_REQUIRE_PROXY_MODULE is set but {SKIP}")
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

P = pm.PAGE_SIZE
SCRATCH = 1 << 20  # where a pointer argument may point: big enough for any count the module writes there
KINDS = (pm.KIND_PIN, pm.KIND_ALLOCATION, pm.KIND_CONTIGUOUS, pm.KIND_ADAPTER, pm.KIND_COMMON)
ERRNOS = {errno.EINVAL, errno.EFAULT, errno.ENOMEM, errno.EBUSY, errno.ENOTTY, errno.EPERM, errno.EOVERFLOW}


class Fuzz:
    def __init__(self, rng: random.Random, device: pm.ProxyDevice) -> None:
        self.rng = rng
        self.device = device
        self.scratch = (ctypes.c_char * SCRATCH)()
        self.ids: list[int] = []  # every id the module handed out, freed or not
        self.maps: list[tuple[int, int]] = []
        self.calls = 0
        self.refused: dict[str, int] = {}

    def u64(self) -> int:
        return self.rng.choice([0, 1, 2, 17, P - 1, P, P + 1, 3 * P + 5, 16 * P, 1 << 20, 4 << 20, 1 << 32,
                                (1 << 32) - 1, 1 << 40, 1 << 52, 1 << 63, (1 << 64) - 1, self.rng.getrandbits(64)])

    def u32(self) -> int:
        return self.rng.choice([0, 1, 2, 3, 4, 5, 7, 255, 1 << 16, (1 << 31), (1 << 32) - 1, *self.ids[-8:]])

    def pointer(self) -> int:
        return self.rng.choice([0, 1, 0xFFFF_8000_0000_0000, (1 << 64) - P, ctypes.addressof(self.scratch)])

    def object_id(self) -> int:
        return self.rng.choice([0, (1 << 32) - 1, *(self.ids[-16:] or [1])])

    def value(self, code: str, name: str) -> int:
        if name in ("runs", "entries"):
            return self.pointer()
        if name == "address":
            return self.rng.choice([self.pointer(), ctypes.addressof(self.scratch) + self.rng.randrange(SCRATCH),
                                    *(a for a, _ in self.maps[-4:])])
        if name in ("id", "adapter"):
            return self.object_id()
        if name == "kind":
            return self.rng.choice([0, *KINDS, 6, (1 << 32) - 1])
        if name in ("capacity", "pages"):
            return self.rng.choice([0, 1, 2, 16, 4096, 65536, 1 << 20, (1 << 32) - 1])
        return self.u32() if code == "I" else self.u64()

    def raw(self, ioctl: str, layout: str) -> None:
        """One ioctl on a structure whose every field is drawn (the reserved ones too, at times)."""
        values: list[int] = []
        for name, code in pm.LAYOUTS[layout].fields:
            count = int(code[:-1] or 1)
            for _ in range(count):
                values.append(0 if name == "reserved" and self.rng.random() < 0.8 else self.value(code[-1], name))
        data = bytearray(pm.LAYOUTS[layout].struct.pack(*values))
        try:
            self.device._ioctl(ioctl, "fuzz", data)
        except OSError as exc:
            assert exc.errno in ERRNOS, f"SAN_PROXY_{ioctl}{tuple(values)}: unexpected errno {exc.errno}: {exc}"
            self.refused[ioctl] = self.refused.get(ioctl, 0) + 1
            return
        out = pm.LAYOUTS[layout].struct.unpack(bytes(data))
        fields = [name for name, code in pm.LAYOUTS[layout].fields for _ in range(int(code[:-1] or 1))]
        if "id" in fields and out[fields.index("id")]:
            self.ids.append(out[fields.index("id")])

    def mmap(self) -> None:
        length = self.rng.choice([0, 1, P, 3 * P, 16 * P, 1 << 30])
        try:
            address = self.device.map(self.object_id(), length)
        except OSError as exc:
            assert exc.errno in ERRNOS | {errno.ENODEV}, exc
            return
        self.maps.append((address, -(-length // P) * P))  # a mapping keeps the file open until all of it goes
        if self.rng.random() < 0.5:
            ctypes.memset(address, 0x5A, 1)  # the mapping is memory that can be written

    IOCTLS = (("PIN", "san_proxy_pin"), ("ALLOCATE", "san_proxy_allocate"),
              ("ALLOCATE_CONTIGUOUS", "san_proxy_contiguous"), ("GET_ADAPTER", "san_proxy_description"),
              ("ALLOCATE_COMMON", "san_proxy_common"), ("FREE", "san_proxy_free"), ("FREE", "san_proxy_free"),
              ("QUERY", "san_proxy_query"), ("PTES", "san_proxy_ptes"), ("INFO", "san_proxy_info"))

    def step(self) -> None:
        self.calls += 1
        action = self.rng.randrange(len(self.IOCTLS) + 2)
        if action == len(self.IOCTLS):
            self.mmap()
        elif action > len(self.IOCTLS):
            if self.maps:
                address, length = self.maps.pop(self.rng.randrange(len(self.maps)))
                pm.libc.munmap(address, length)
        else:
            self.raw(*self.IOCTLS[action])


@pytest.fixture
def watch() -> Iterator[KernelLogWatch]:
    lookout = KernelLogWatch()
    yield lookout
    lookout.close()


def test_arbitrary_arguments_get_a_result_or_an_errno_and_leave_nothing(watch: KernelLogWatch) -> None:
    seed = int(os.environ.get("SAN_FUZZ_SEED") or random.SystemRandom().getrandbits(32))
    calls = int(os.environ.get("SAN_FUZZ_CALLS") or 3000)
    print(f"san_proxy fuzz: seed {seed} (SAN_FUZZ_SEED={seed} replays it), {calls} calls")
    before = pm.live_counts()
    device = pm.ProxyDevice()
    fuzz = Fuzz(random.Random(seed), device)
    try:
        for _ in range(calls):
            fuzz.step()
        assert fuzz.ids, "no call ever succeeded: the fuzz reached nothing"
    finally:
        for address, length in fuzz.maps:
            pm.libc.munmap(address, length)
        device.close()
    assert watch.unavailable is None or not os.access("/dev/kmsg", os.R_OK)
    trouble = watch.trouble()
    assert trouble == [], f"seed {seed}: the kernel logged trouble:\n" + "\n".join(trouble)
    assert pm.live_counts() == before, f"seed {seed}: the module still holds {pm.live_counts()} (before: {before})"
    print(f"san_proxy fuzz: {fuzz.calls} calls, {len(fuzz.ids)} objects made, refused per ioctl: {fuzz.refused}")
