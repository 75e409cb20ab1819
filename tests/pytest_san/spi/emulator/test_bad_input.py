"""Bad input never makes the emulator break the rules it checks (issue 9, CONTRACT.md section 4).

Each finding of the issue has a test here: a refused call leaves registrations, in-use marks, socket
state and every byte as they were. The property-based fuzz (test_fuzz_spi.py) covers the whole class.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_san import PAGE_SIZE, SO_MAX_RDMA_SIZE, Access, CacheType, DeviceDescription, SanError, Status, WsaError
from pytest_san.spi.contract import DESCRIPTOR_SIZE
from pytest_san.spi.emulator import EmulatedBuffer, EmulatedProcess, EmulatorBackend

GUARD = 0xA5


class Pair:
    """A raw connected socket pair: a registered 64-byte source on ``a``, a guarded 16-byte WRITE
    window on ``b`` (inside a 4 KiB mapping full of guard bytes), and a registered sink on ``a``."""

    def __init__(self) -> None:
        self.backend = EmulatorBackend()
        nodes = self.backend.nodes
        self.pa, self.pb = nodes[0].default_process, nodes[1].default_process
        self.sa, self.sb = self.backend.connect_sockets(self.pa, self.pb)
        self.A, self.B = nodes[0].provider, nodes[1].provider
        self.src = self.pa.alloc(64)
        self.src.write(bytes(range(1, 65)))
        self.h = self.A.register_memory(self.sa, self.src, Access.READWRITE)
        self.peer = self.pb.alloc(4096)
        self.peer.write(bytes([GUARD]) * 4096)
        self.target = self.peer.view(2048, 16)
        self.desc = self.B.register_rdma_memory(self.sb, self.target, Access.READWRITE)

    def snapshot(self) -> tuple[object, ...]:
        regs = [(r.kind, r.address, r.length, r.flags, r.refs, r.in_use)
                for s in (self.sa, self.sb) for r in s.provider.registrations(s)]
        mappings = [(len(m), bytes(m)) for p in (self.pa, self.pb) for m in p._maps.values()]
        live = [n.base_proxy.live_allocations() for n in self.backend.nodes]
        return regs, mappings, live, self.sa.state, self.sb.state

    def clean_teardown(self) -> None:
        """Every registration deregisters (nothing was left marked in use), the sockets close, no leak."""
        self.A.deregister_memory(self.sa, self.h)
        self.B.deregister_rdma_memory(self.sb, self.desc)
        assert self.A.registrations(self.sa) == [] and self.B.registrations(self.sb) == []
        self.A.close_socket(self.sa)
        self.B.close_socket(self.sb)
        assert self.backend.leaks() == []


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.clean_teardown()


def _negative(pair: Pair, how: str, process: EmulatedProcess | None = None) -> Any:
    """A buffer of length -16 whose address lies inside the registered source (or sink)."""
    process = process or pair.pa
    address = pair.src.address + 40
    if how == "buffer_at":
        return process.buffer_at(address, -16)
    if how == "constructed":
        return EmulatedBuffer(process, address, -16, None, 0)
    if how == "mutated_view":
        view = pair.src.view(40, 16)
        view.length = -16
        return view
    return types.SimpleNamespace(address=address, length=-16, process=process)


NEGATIVE = ["buffer_at", "constructed", "mutated_view", "duck"]


# -- finding 1: negative-length local buffers ---------------------------------------------------------


@pytest.mark.parametrize("how", NEGATIVE)
@pytest.mark.parametrize("with_good_first", [False, True])
def test_negative_length_rdma_write_source_is_einval_and_moves_nothing(pair: Pair, how: str,
                                                                       with_good_first: bool) -> None:
    before = pair.snapshot()
    entries = [(pair.src.view(0, 8), pair.h)] if with_good_first else []
    entries.append((_negative(pair, how), pair.h))
    with pytest.raises(SanError) as info:
        pair.A.rdma_write(pair.sa, entries, pair.desc, 0)
    assert info.value.code is WsaError.WSAEINVAL, info.value
    assert pair.snapshot() == before  # the peer's bytes (guards too), its mapping's size, every count
    assert pair.peer.read() == bytes([GUARD]) * 4096


@pytest.mark.parametrize("offset", [0, 8, 15])
def test_negative_length_with_short_source_never_resizes_the_peer_mapping(pair: Pair, offset: int) -> None:
    short = pair.src.view(60, 4)
    short.length = -30  # reaches back over the source, more than the window holds
    with pytest.raises(SanError):
        pair.A.rdma_write(pair.sa, [(short, pair.h)], pair.desc, offset)
    assert len(pair.peer.mem or b"") == 4096 and pair.peer.read() == bytes([GUARD]) * 4096


@pytest.mark.parametrize("how", NEGATIVE)
def test_negative_length_rdma_read_sink_is_einval_and_moves_nothing(pair: Pair, how: str) -> None:
    before = pair.snapshot()
    with pytest.raises(SanError) as info:
        pair.A.rdma_read(pair.sa, [(_negative(pair, how), pair.h)], pair.desc, 0)
    assert info.value.code is WsaError.WSAEINVAL, info.value
    assert pair.snapshot() == before
    assert pair.src.read() == bytes(range(1, 65))


@pytest.mark.parametrize("method", ["send", "recv"])
def test_negative_length_message_buffer_is_einval(pair: Pair, method: str) -> None:
    before = pair.snapshot()
    with pytest.raises(SanError) as info:
        getattr(pair.A, method)(pair.sa, [(_negative(pair, "buffer_at"), pair.h)])
    assert info.value.code is WsaError.WSAEINVAL
    assert pair.snapshot() == before


@pytest.mark.parametrize("how", NEGATIVE)
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
def test_negative_length_registration_is_einval(pair: Pair, how: str, register: str) -> None:
    before = pair.snapshot()
    with pytest.raises(SanError) as info:
        getattr(pair.A, register)(pair.sa, _negative(pair, how), Access.READ)
    assert info.value.code is WsaError.WSAEINVAL
    assert pair.snapshot() == before


def test_zero_length_entries_are_allowed_and_move_nothing(pair: Pair) -> None:
    entries = [(pair.src.view(0, 0), pair.h), (pair.src.view(8, 4), pair.h), (pair.src.view(64, 0), pair.h)]
    done = pair.A.rdma_write(pair.sa, entries, pair.desc, 2).wait(0)
    assert done.status is Status.SUCCESS and done.bytes == 4
    assert pair.peer.read() == bytes([GUARD]) * 2050 + bytes(range(9, 13)) + bytes([GUARD]) * 2042
    done = pair.A.rdma_write(pair.sa, [(pair.src.view(3, 0), pair.h)], pair.desc, 16).wait(0)
    assert done.status is Status.SUCCESS and done.bytes == 0  # at the window's very end: still in bounds


# -- finding 2: malformed scatter lists -------------------------------------------------------------


def _malformed(pair: Pair) -> dict[str, Any]:
    good = (pair.src.view(0, 8), pair.h)
    return {
        "None": None,
        "a pair, not a list": good,
        "a string": "src",
        "a generator": (x for x in [good]),
        "None after a good pair": [good, None],
        "a 1-tuple after a good pair": [good, (pair.src,)],
        "a 3-tuple after a good pair": [good, (pair.src, pair.h, 0)],
        "(None, handle) after a good pair": [good, (None, pair.h)],
        "(int, handle) after a good pair": [good, (5, pair.h)],
        "a good pair twice, then junk": [good, good, ("buffer", pair.h)],
    }


MALFORMED = ["None", "a pair, not a list", "a string", "a generator", "None after a good pair",
             "a 1-tuple after a good pair", "a 3-tuple after a good pair", "(None, handle) after a good pair",
             "(int, handle) after a good pair", "a good pair twice, then junk"]


@pytest.mark.parametrize("case", MALFORMED)
@pytest.mark.parametrize("method", ["rdma_write", "rdma_read", "send", "recv"])
def test_malformed_scatter_list_is_type_error_before_anything_is_in_use(pair: Pair, case: str,
                                                                        method: str) -> None:
    before = pair.snapshot()
    buffers = _malformed(pair)[case]
    call: Callable[[], Any]
    if method.startswith("rdma"):
        def call() -> Any:
            return getattr(pair.A, method)(pair.sa, buffers, pair.desc, 0)
    else:
        def call() -> Any:
            return getattr(pair.A, method)(pair.sa, buffers)
    with pytest.raises(TypeError, match="buffers"):  # names the argument
        call()
    assert pair.snapshot() == before  # in particular: no registration left marked in use
    # (the fixture's teardown deregisters the handle: it would be WSAEINVAL "in use" otherwise)


def test_non_buffer_with_bad_field_types_is_einval(pair: Pair) -> None:
    before = pair.snapshot()
    for address, length in [(float(pair.src.address), 8), (pair.src.address, 8.0), (pair.src.address, True),
                            (str(pair.src.address), 8), (None, None)]:
        fake = types.SimpleNamespace(address=address, length=length, process=pair.pa)
        with pytest.raises(SanError) as info:
            pair.A.rdma_write(pair.sa, [(fake, pair.h)], pair.desc, 0)
        assert info.value.code is WsaError.WSAEINVAL
        with pytest.raises(SanError) as info:
            pair.A.register_memory(pair.sa, fake, Access.READ)
        assert info.value.code is WsaError.WSAEINVAL
    assert pair.snapshot() == before


# -- finding 4: argument types that leaked exceptions or were accepted ---------------------------------


@pytest.mark.parametrize("option", ["x", None, 1.5, float(SO_MAX_RDMA_SIZE), True, b"\x0d\x70", [SO_MAX_RDMA_SIZE]])
def test_getsockopt_of_a_non_option_is_einval(pair: Pair, option: object) -> None:
    with pytest.raises(SanError) as info:
        pair.A.getsockopt(pair.sa, option)
    assert info.value.code is WsaError.WSAEINVAL


@pytest.mark.parametrize("size", ["20", 20.0, float(DESCRIPTOR_SIZE), True, b"20", [20]])
def test_descriptor_size_of_a_non_integer_is_einval(pair: Pair, size: object) -> None:
    before = pair.snapshot()
    with pytest.raises(SanError) as info:
        pair.A.register_rdma_memory(pair.sa, pair.src, Access.READ, size)
    assert info.value.code is WsaError.WSAEINVAL and info.value.required_size is None
    assert pair.snapshot() == before


@pytest.mark.parametrize("access", [True, False, 1.0, 2.0, 3.0, "1", None, [1], b"\x01", 1 + 0j])
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
def test_access_that_only_equals_a_flag_is_einval(pair: Pair, access: object, register: str) -> None:
    before = pair.snapshot()
    with pytest.raises(SanError) as info:
        getattr(pair.A, register)(pair.sa, pair.src, access)
    assert info.value.code is WsaError.WSAEINVAL
    assert pair.snapshot() == before


@pytest.mark.parametrize("buffer", [None, 0, "buffer", b"\0" * 64, object()])
@pytest.mark.parametrize("register", ["register_memory", "register_rdma_memory"])
def test_a_non_buffer_is_type_error_naming_the_argument(pair: Pair, buffer: object, register: str) -> None:
    before = pair.snapshot()
    with pytest.raises(TypeError, match="buffer"):
        getattr(pair.A, register)(pair.sa, buffer, Access.READ)
    assert pair.snapshot() == before


def test_offset_of_a_non_integer_is_einval(pair: Pair) -> None:
    before = pair.snapshot()
    for offset in (True, 0.0, "0", None):
        with pytest.raises(SanError) as info:
            pair.A.rdma_write(pair.sa, [(pair.src.view(0, 8), pair.h)], pair.desc, offset)
        assert info.value.code is WsaError.WSAEINVAL
    assert pair.snapshot() == before


def test_registrations_of_a_foreign_or_junk_socket_is_enotsock(pair: Pair) -> None:
    for junk in (pair.sb, None, 3, "socket"):
        with pytest.raises(SanError) as info:
            pair.A.registrations(junk)
        assert info.value.code is WsaError.WSAENOTSOCK


# -- the process and buffer API --------------------------------------------------------------------------


def test_process_and_buffer_api_refuse_non_integers_by_name(pair: Pair) -> None:
    p = pair.pa
    for call in (lambda: p.alloc(1.5), lambda: p.alloc("64"), lambda: p.alloc(True), lambda: p.alloc(None),
                 lambda: p.buffer_at(float(pair.src.address), 8), lambda: p.buffer_at(pair.src.address, "8"),
                 lambda: pair.src.read(1.0), lambda: pair.src.read(4, None), lambda: pair.src.view(0, 2.0),
                 lambda: pair.src.write(b"x", True), lambda: pair.src.write("text"), lambda: pair.src.write(None),
                 lambda: EmulatedBuffer(p, 1.5, 8, None, 0), lambda: EmulatedBuffer(None, 0, 8, None, 0)):
        with pytest.raises(TypeError):
            call()
    with pytest.raises(SanError) as info:
        p.alloc(1 << 62)  # not a MemoryError
    assert info.value.code is WsaError.WSAENOBUFS
    with pytest.raises(ValueError):
        EmulatedBuffer(p, pair.src.address, 64, bytearray(8), 0)  # a range the mapping does not hold


def test_a_buffer_whose_fields_were_changed_never_reaches_outside_its_mapping(pair: Pair) -> None:
    before = pair.snapshot()
    view = pair.src.view(8, 8)
    view.offset = -8  # would slice from the end of the mapping and grow it
    with pytest.raises(SanError):
        view.write(b"z" * 8)
    view.offset, view.length = PAGE_SIZE - 4, 8  # past the end of the mapping (its last page)
    with pytest.raises(SanError):
        view.read()
    assert pair.snapshot() == before


def test_wait_refuses_a_non_number_timeout(pair: Pair) -> None:
    sink = pair.pb.alloc(8)
    handle = pair.B.register_memory(pair.sb, sink, Access.WRITE)
    op = pair.B.recv(pair.sb, [(sink, handle)])  # stays pending: nobody sends
    for timeout in ("1", [1], True):
        with pytest.raises(TypeError):
            op.wait(timeout)
    with pytest.raises(ValueError):
        op.wait(float("nan"))
    with pytest.raises(TimeoutError):
        op.wait(0.0)
    pair.B.close_socket(pair.sb)
    assert op.wait(1e300).status is Status.ABORTED  # beyond threading's maximum: not an OverflowError
    pair.sb = pair.backend.connect_sockets(pair.pa, pair.pb)[1]  # for the teardown
    pair.desc = pair.B.register_rdma_memory(pair.sb, pair.target, Access.READWRITE)


# -- the proxy -------------------------------------------------------------------------------------------


def test_proxy_refuses_non_integers_and_bool_cache_types_before_changing_anything() -> None:
    backend = EmulatorBackend(1)
    proxy = backend.nodes[0].proxy
    calls: list[Callable[[], Any]] = [
        lambda: proxy.allocate(1.5), lambda: proxy.allocate("4096"), lambda: proxy.allocate(True),
        lambda: proxy.allocate(None), lambda: proxy.free(None), lambda: proxy.free([]), lambda: proxy.free({}),
        lambda: proxy.allocate_contiguous(4096.0, 0, 1 << 32, 0, CacheType.CACHED),
        lambda: proxy.allocate_contiguous(4096, 0, "high", 0, CacheType.CACHED),
        lambda: proxy.allocate_contiguous(4096, 0, 1 << 32, 0, True),
        lambda: proxy.allocate_contiguous(4096, 0, 1 << 32, 0, 1.0),
        lambda: proxy.allocate_contiguous(4096, 0, 1 << 32, 0, None),
        lambda: proxy.free_contiguous(None, 4096, CacheType.CACHED),
        lambda: proxy.free_contiguous([], 4096, CacheType.CACHED),
    ]
    for call in calls:
        with pytest.raises(SanError) as info:
            call()
        assert info.value.code is WsaError.WSAEINVAL
    assert proxy.live_allocations() == 0
    base = proxy.allocate_contiguous(4096, 0, 1 << 32, 0, CacheType.CACHED)
    assert base is not None
    for call in (lambda: proxy.free_contiguous(float(base), 4096, CacheType.CACHED),
                 lambda: proxy.free_contiguous(base, 4096.0, CacheType.CACHED),
                 lambda: proxy.free_contiguous(base, 4096, True)):
        with pytest.raises(SanError):
            call()
        assert proxy.live_allocations() == 1
    proxy.free_contiguous(base, 4096, CacheType.CACHED)
    assert backend.leaks() == []


def test_dma_adapter_refuses_fields_and_arguments_of_the_wrong_type() -> None:
    proxy = EmulatorBackend(1).nodes[0].proxy
    good = dict(version=2, master=True, scatter_gather=True, dma32=True, dma64=False, maximum_length=1 << 20,
                interface_type=0)
    for name, value in [("version", "2"), ("version", 2.0), ("maximum_length", "big"), ("maximum_length", True),
                        ("dma64", 1), ("dma32", "yes"), ("scatter_gather", 0), ("interface_type", 0.0)]:
        with pytest.raises(SanError, match=name) as info:
            proxy.get_dma_adapter(DeviceDescription(**{**good, name: value}))
        assert info.value.code is WsaError.WSAEINVAL
    assert proxy.live_allocations() == 0
    adapter = proxy.get_dma_adapter(DeviceDescription(**good))  # type: ignore[arg-type]
    for length, cache in [(4096.0, True), ("4096", True), (True, True), (4096, 1), (4096, None)]:
        with pytest.raises(SanError):
            adapter.allocate_common_buffer(length, cache)
    assert proxy.live_allocations() == 1
    got = adapter.allocate_common_buffer(4096, True)
    assert got is not None
    virtual, logical = got
    for args in [(4096, float(logical), virtual, True), (4096, [logical], virtual, True),
                 (4096, logical, virtual, 1), (4096.0, logical, virtual, True), (4096, logical, None, True)]:
        with pytest.raises(SanError):
            adapter.free_common_buffer(*args)
        assert proxy.live_allocations() == 2
    adapter.free_common_buffer(4096, logical, virtual, True)
    proxy.put_dma_adapter(adapter)
    assert proxy.live_allocations() == 0
    with pytest.raises(TypeError):
        proxy.set_nolowmem("yes")  # type: ignore[arg-type]


def test_backend_refuses_junk_and_foreign_nodes_processes_and_sockets() -> None:
    backend, other = EmulatorBackend(2), EmulatorBackend(2)
    p = backend.nodes[0].default_process
    with pytest.raises(ValueError):
        backend.connect_sockets(p, other.nodes[1].default_process)
    with pytest.raises(TypeError):
        backend.connect_sockets(p, None)
    assert backend.sockets() == [] and other.sockets() == []
    for call in (lambda: backend.faults.fail_allocations(other.nodes[0], 1),
                 lambda: backend.faults.fail_allocations(None, 1),
                 lambda: backend.faults.drop_link(backend.nodes[0], "node1")):
        with pytest.raises(ValueError):
            call()
    for count in (1.0, "1", True):
        with pytest.raises(TypeError):
            backend.faults.fail_allocations(backend.nodes[0], count)
    for junk in (None, "socket", p):
        with pytest.raises(TypeError):
            backend.faults.hold(junk)


def test_a_buffer_is_always_of_its_own_process_memory(pair: Pair) -> None:
    """A buffer made by hand over another process's mapping would write into that process."""
    with pytest.raises(ValueError):
        EmulatedBuffer(pair.pa, pair.peer.address, 64, pair.peer.mem, 0)
    with pytest.raises(ValueError):
        EmulatedBuffer(pair.pa, pair.src.address + 8, 8, pair.src.mem, 0)  # the wrong offset into it
    doomed = pair.backend.nodes[0].spawn_process()
    buf = doomed.alloc(16)
    doomed.kill()
    with pytest.raises(SanError):
        buf.view(0, 8).read()  # a view of a dead process's buffer is of nothing mapped


@pytest.mark.parametrize(("count", "error"), [(0, ValueError), (256, ValueError), (2.0, TypeError),
                                              ("3", TypeError), (True, TypeError)])
def test_backend_node_count_is_checked(count: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        EmulatorBackend(count)


def test_a_malformed_scatter_list_is_the_type_error_whatever_the_descriptor() -> None:
    """Found by the SPI fuzz (a tox env's random seed): a pair of a tuple subclass beside a memoryview descriptor
    was answered WSAEINVAL for the descriptor; it is the TypeError naming the entry, as over hil."""
    import collections

    backend = EmulatorBackend()
    node = backend.nodes[0]
    sock, _ = backend.connect_sockets(node.default_process, node.spawn_process())
    buf = node.default_process.alloc(16)
    handle = node.provider.register_memory(sock, buf, Access.WRITE)
    pair = collections.namedtuple("Pair", "buffer handle")(buf, handle)
    for call in (node.provider.rdma_read, node.provider.rdma_write):
        with pytest.raises(TypeError, match=r"local_buffers\[1\]"):
            call(sock, [(buf, handle), pair], memoryview(b"x" * 20), 0)
    assert [r.refs for r in node.provider.registrations(sock)] == [1]
