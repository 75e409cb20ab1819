"""What the SAN fixtures cost on the remote path, in agent round trips (issue 11): at most 3 per host per test,
closing the test's connections, the leak check and the reset included. Counted, not timed: the bound holds on
any machine. Over a real OpenSSH server (engine emulator, loopback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from hil.controller.backend import HilBackend
from hil.inventory import HostConfig
from pytest_san import Access, Switch
from pytest_san.batch import Batch, Later, batch, is_alive, is_closed, is_connected, is_done, made_one_by_one, wait_for
from tests.hil.controller.test_hil import inventory

BOUND = 3

TESTS = '''
from pytest_san import Access, Status

def test_provider_only(san_provider, san_proxy, san_backend):
    process = san_backend.nodes[0].default_process
    assert process.alive

def test_connection(san_switch):
    conn = san_switch.connect()
    conn.local.send(b"hello")
    assert conn.remote.recv(5) == b"hello"

def test_two_connections_and_rdma(san_switch):
    conn = san_switch.connect()
    san_switch.connect()
    a, b = conn.local, conn.remote
    src = a.process.alloc(4096)
    src.write(b"x" * 4096)
    h = a.provider.register_memory(a.socket, src, Access.READ)
    dst = b.process.alloc(4096)
    desc = b.provider.register_rdma_memory(b.socket, dst, Access.WRITE)
    done = a.provider.rdma_write(a.socket, [(src, h)], desc).wait(10)
    assert done.status is Status.SUCCESS
    a.provider.deregister_memory(a.socket, h)
    b.provider.deregister_rdma_memory(b.socket, desc)

def test_connection_closed_by_the_test(san_switch):
    san_switch.connect().close()

def test_leak(san_switch):
    conn = san_switch.connect()
    conn.local.proxy.allocate(4096)
'''

CONFTEST = '''
import json, os

def pytest_runtest_logreport(report):
    if report.when == "teardown":
        with open(os.environ["ROUND_TRIPS_OUT"], "a") as f:
            f.write(json.dumps([report.nodeid, dict(report.user_properties).get("san_round_trips"),
                                report.outcome, report.longreprtext[:300]]) + "\\n")
'''


def test_the_san_fixtures_cost_at_most_three_round_trips_per_host(
        pytester: pytest.Pytester, sshd_host: HostConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    out = pytester.path / "round_trips.jsonl"
    monkeypatch.setenv("ROUND_TRIPS_OUT", str(out))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fixtures=TESTS)
    inv = inventory(pytester.path / "lab.json", sshd_host)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--san-backend=hil", f"--san-inventory={inv}")
    result.assert_outcomes(passed=5, errors=1)  # test_leak errors at teardown: its leak (R11) is still found
    rows = {nodeid.split("::")[-1]: (spent, outcome, text)
            for nodeid, spent, outcome, text in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"test_provider_only", "test_connection", "test_two_connections_and_rdma",
                         "test_connection_closed_by_the_test", "test_leak"}
    for name, (spent, _, _) in rows.items():
        assert spent is not None, name
        for host in {*spent["setup"], *spent["teardown"]}:
            total = spent["setup"].get(host, 0) + spent["teardown"].get(host, 0)
            assert 1 <= total <= BOUND, (name, host, spent)
    assert rows["test_leak"][1] == "failed" and "SAN leak (R11)" in rows["test_leak"][2]


@pytest.mark.parametrize("family", ["xunit2", "xunit1"])
def test_the_round_trips_stay_out_of_an_xunit2_junit_file(pytester: pytest.Pytester, sshd_host: HostConfig,
                                                           family: str) -> None:
    """xunit2 has no per-test properties (CONTRACT.md 5.1), yet pytest writes a test's user properties into
    any family: the round trips the hil backend records on each test (on the item, where
    benchmarks/roundtrips.py reads them) are left out of such a file, and stay in an xunit1 file."""
    import xml.etree.ElementTree as ET

    out = pytester.path / "round_trips.jsonl"
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("ROUND_TRIPS_OUT", str(out))
    try:
        pytester.makeconftest(CONFTEST)
        pytester.makepyfile(test_fixtures=TESTS.split("def test_leak")[0])
        inv = inventory(pytester.path / "lab.json", sshd_host)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", "--san-backend=hil",
                                               f"--san-inventory={inv}", "--junitxml=j.xml",
                                               "-o", f"junit_family={family}")
    finally:
        monkeypatch.undo()
    result.assert_outcomes(passed=4)
    spent = [json.loads(row)[1] for row in out.read_text().splitlines()]  # the teardown reports'
    root = ET.parse(pytester.path / "j.xml").getroot()
    names = {p.get("name") for case in root.iter("testcase") for p in case.iter("property")}
    if family == "xunit2":
        assert not any(case.find("properties") is not None for case in root.iter("testcase"))
        assert spent == [None] * 4
    else:
        assert all(spent) and "san_round_trips" in names and "san_rule" not in names  # these tests declare no rule


def test_end_test_closes_checks_and_resets_in_two_round_trips(sshd_host: HostConfig) -> None:
    backend = HilBackend([sshd_host])
    try:
        switch = Switch(backend)
        conn = switch.connect()
        buf = conn.local.process.alloc(4096)
        conn.local.provider.register_memory(conn.local.socket, buf, Access.READ)  # released by close_socket
        before = backend.round_trips()
        leaks, errors = backend.end_test(switch.close_all)
        after = backend.round_trips()
        assert (leaks, errors) == ([], [])
        assert {h: after[h] - before[h] for h in after} == {sshd_host.name: 2}
        assert ("remote", "close_socket") in conn.trace and ("local", "close_socket") in conn.trace
        # The next test starts clean, its default process already known: a connect asks no default_process.
        node = backend.nodes[0]
        assert node.default_process.alive
        before = backend.round_trips()
        leaks, errors = backend.end_test()
        assert (leaks, errors) == ([], []) and backend.round_trips()[sshd_host.name] - before[sshd_host.name] == 1
    finally:
        backend.close()


def test_a_deferred_close_error_is_reported(sshd_host: HostConfig) -> None:
    backend = HilBackend([sshd_host])
    try:
        switch = Switch(backend)
        conn = switch.connect()
        conn.local.provider.close_socket(conn.local.socket)  # the test closed it behind the switch's back
        leaks, errors = backend.end_test(switch.close_all)
        assert leaks == []
        assert all(type(e).__name__ == "SanError" for e in errors)
    finally:
        backend.close()


def test_reads_made_together_cost_one_round_trip_and_answer_as_made_alone(sshd_host: HostConfig) -> None:
    """A batch of reads (the model's checks): socket states, registrations, bytes, proxy counts and completions
    in one round trip; the answers (errors included) are those the objects give alone."""
    from pytest_san import SanError, Status, WsaError

    backend = HilBackend([sshd_host])
    try:
        node = backend.nodes[0]
        p, q = node.default_process, node.spawn_process()
        provider = node.provider
        a_sock, b_sock = backend.connect_sockets(p, q)
        closed, _ = backend.connect_sockets(p, q)
        buf = p.alloc(64)
        buf.write(b"q" * 64)
        provider.register_memory(a_sock, buf, Access.READ)
        sink = q.alloc(8)
        recv = provider.recv(b_sock, [(sink, provider.register_memory(b_sock, sink, Access.WRITE))])
        provider.close_socket(closed)
        proxy = node.proxy
        not_a_socket: Any = 424242

        def shown(registrations: Any) -> object:
            if isinstance(registrations, SanError):
                return registrations.code
            return sorted((r.kind, r.length, int(r.access)) for r in registrations)

        def alone() -> list[object]:
            answers: list[object] = []
            for sock in (a_sock, b_sock, closed):
                answers += [sock.connected, sock.closed]
            for sock in (a_sock, closed, not_a_socket):
                try:
                    answers.append(shown(provider.registrations(sock)))
                except SanError as exc:
                    answers.append(shown(exc))
            return [*answers, buf.read(), proxy.live_allocations(), recv.done()]

        expected = alone()
        before = backend.round_trips()[sshd_host.name]
        with batch(backend) as b:
            states = [b.call(read, sock) for sock in (a_sock, b_sock, closed) for read in (is_connected, is_closed)]
            registrations = [b.call(provider.registrations, sock) for sock in (a_sock, closed, not_a_socket)]
            rest = [b.call(buf.read), b.call(proxy.live_allocations), b.call(recv.done)]
        assert backend.round_trips()[sshd_host.name] - before == 1
        together = [*(s.value for s in states), *(shown(r.outcome[1]) for r in registrations),
                    *(r.value for r in rest)]
        assert together == expected
        assert expected[:6] == [True, False, True, False, False, True] and expected[-1] is False
        assert expected[6] == [("memory", 64, int(Access.READ))] and expected[8] == WsaError.WSAENOTSOCK
        provider.send(a_sock, [(buf.view(0, 8), provider.register_memory(a_sock, buf, Access.READ))])
        assert recv.wait(10).status is Status.SUCCESS  # a read made together is not kept as the answer after
    finally:
        backend.close()


def test_the_switch_builds_a_connection_in_a_few_round_trips(sshd_host: HostConfig) -> None:
    """switch.connect(): the sockets (connect_local: one round trip on one host), then both ends' allocations with
    their registrations and the threshold together, then both ends' receives together (was 26 in all, then 8
    with a group each for the threshold and each end's allocations, registrations and receives)."""
    backend = HilBackend([sshd_host])
    try:
        switch = Switch(backend)
        node = backend.nodes[0]
        assert node.default_process.alive
        peer = node.spawn_process()
        before = backend.round_trips()[sshd_host.name]
        conn = switch.connect(peer=peer)  # no question of its own about peer (is it a process, a node?)
        assert backend.round_trips()[sshd_host.name] - before == 1 + 2
        assert [m for _, m in conn.trace] == ["register_memory"] * 4
        conn.local.send(b"together")
        assert conn.remote.recv(8) == b"together"
        conn.close()
        assert backend.leaks() == []
    finally:
        backend.close()


def test_a_failed_call_among_those_made_together_is_its_own(sshd_host: HostConfig) -> None:
    """A batch on hil: each call's outcome is its own (a failure does not stop or spoil the others) and
    a failed build of a connection's end releases what the others built (all or nothing)."""
    from pytest_san import SanError, WsaError
    from pytest_san.spi.contract import QUEUE_DEPTH

    backend = HilBackend([sshd_host])
    try:
        node = backend.nodes[0]
        p = node.default_process
        a, _ = backend.connect_sockets(p, node.spawn_process())
        buf = p.alloc(64)
        before = backend.round_trips()[sshd_host.name]
        with batch(backend) as b:
            made = [b.call(node.provider.register_memory, a, buf, Access.READ),
                    b.call(node.provider.register_memory, a, buf, cast(Access, 7)), b.call(p.alloc, 32)]
        assert backend.round_trips()[sshd_host.name] - before == 1
        handle, error, more = (later.outcome[1] for later in made)
        assert [later.error is None for later in made] == [True, False, True] and isinstance(handle, int)
        assert isinstance(error, SanError) and error.code is WsaError.WSAEINVAL
        assert more.length == 32 and more.process is p
        assert [r.refs for r in node.provider.registrations(a)] == [1]
        # A connect whose receives cannot all be posted (the receive queue holds QUEUE_DEPTH) releases everything.
        with pytest.raises(SanError) as failed:
            Switch(backend).connect(message_count=QUEUE_DEPTH + 1)
        assert failed.value.code is WsaError.WSAENETDOWN
        node.provider.close_socket(a)
        assert backend.leaks() == []
    finally:
        backend.close()


def test_allocations_and_their_frees_go_together_and_answer_as_made_alone(sshd_host: HostConfig) -> None:
    """A proxy's allocate and a free naming it (``Later.ref``) in one round trip; a free of what is already free
    fails there as it does alone, and the proxy's count ends where it began."""
    from pytest_san import WsaError

    backend = HilBackend([sshd_host])
    try:
        proxy = backend.nodes[0].proxy
        start = proxy.live_allocations()
        before = backend.round_trips()[sshd_host.name]
        with batch(backend) as b:
            first = b.call(proxy.allocate, 4096)
            made = [first, b.call(proxy.free, first.ref)]
            second = b.call(proxy.allocate, 8192)
            made += [second, b.call(proxy.free, second.ref), b.call(proxy.free, first.ref)]
        assert backend.round_trips()[sshd_host.name] - before == 1
        alone = made_one_by_one(b.calls)
        assert [(later.error is None, type(later.outcome[1])) for later in made] == \
            [(ok, type(value)) for ok, value in alone]
        assert [later.error is None for later in made] == [True, True, True, True, False]
        assert first.value.length >= 4096 and second.value.length >= 8192
        assert getattr(made[4].error, "code", None) is alone[4][1].code is WsaError.WSAEINVAL
        assert proxy.live_allocations() == start
    finally:
        backend.close()


def test_whether_processes_are_alive_is_asked_together(sshd_host: HostConfig) -> None:
    backend = HilBackend([sshd_host])
    try:
        node = backend.nodes[0]
        p, q = node.default_process, node.spawn_process()
        q.kill()
        before = backend.round_trips()[sshd_host.name]
        with batch(backend) as b:
            answers = [b.call(is_alive, p), b.call(is_alive, q)]
        assert backend.round_trips()[sshd_host.name] - before == 1
        assert [a.value for a in answers] == [True, False] == [p.alive, q.alive]
    finally:
        backend.close()


@pytest.fixture
def sshd_host(sshd: object, tmp_path: Path) -> HostConfig:
    host: HostConfig = sshd.host_config(name="lab1", engine="emulator", loopback=True)  # type: ignore[attr-defined]
    return host


def _chain(b: Batch, node: Any, sock: Any, fail: bool = False) -> list[Later[Any]]:
    """alloc, its write, a registration of it, a receive into it, a wait: each names what an earlier one returned."""
    p, provider = node.default_process, node.provider
    buf = b.call(p.alloc, 16)
    threshold = b.call(provider.getsockopt, sock, 0x700D)
    handle = b.call(provider.register_memory, sock, buf.ref, cast(Access, 7) if fail else Access.WRITE)
    recv = b.call(provider.recv, sock, [(buf.ref, handle.ref)])
    return [buf, threshold, handle, recv, b.call(is_done, recv.ref), b.call(wait_for, recv.ref, 0.5),
            b.call(is_connected, sock), b.call(provider.registrations, sock)]


def _shown(laters: list[Later[Any]]) -> list[Any]:
    """Outcomes as comparable values: errors by type and code, buffers by length, registrations by fields."""
    out: list[Any] = []
    for ok, value in (later.outcome for later in laters):
        if not ok:
            out.append((type(value).__name__, getattr(value, "code", None)))
        elif hasattr(value, "length") and hasattr(value, "process"):
            out.append(("buffer", value.length))
        elif isinstance(value, list):
            out.append(sorted((r.kind, r.length, int(r.access), r.refs) for r in value))
        elif hasattr(value, "status"):
            out.append((value.status, value.bytes))
        elif type(value).__name__.endswith("Operation"):
            out.append("operation")
        else:
            out.append(type(value).__name__ if isinstance(value, int) and not isinstance(value, bool) else value)
    return out


@pytest.mark.parametrize("fail", [False, True], ids=["chain", "a-failed-link"])
def test_calls_naming_earlier_results_go_in_one_round_trip_and_answer_as_alone(sshd_host: HostConfig,
                                                                                 fail: bool) -> None:
    """``Later.ref`` in a batch on hil: an allocation, a registration of it, a receive into it and waits for that
    receive, one round trip in all; the outcomes are those of the same calls made on the emulator in-process (a
    call naming a failed one fails the same, unmade)."""
    from pytest_san.spi.emulator import EmulatorBackend

    alone = EmulatorBackend()
    a, _ = alone.connect_sockets(alone.nodes[0].default_process, alone.nodes[0].spawn_process())
    with batch(alone) as b:
        made_alone = _chain(b, alone.nodes[0], a, fail)
    expected = _shown(made_alone)
    backend = HilBackend([sshd_host])
    try:
        node = backend.nodes[0]
        sock, _ = backend.connect_sockets(node.default_process, node.spawn_process())
        before = backend.round_trips()[sshd_host.name]
        with batch(backend) as b:
            made = _chain(b, node, sock, fail)
        assert backend.round_trips()[sshd_host.name] - before == 1
        assert _shown(made) == expected
        if fail:
            assert [later.error is None for later in made[2:6]] == [False] * 4
            assert all(later.error is made[2].error for later in made[3:6])  # the same failure, unmade
        else:
            assert expected[4:6] == [False, ("TimeoutError", None)]  # nothing sent: the receive waits
        node.provider.close_socket(sock)
        assert backend.leaks() == []
    finally:
        backend.close()


def test_a_call_naming_another_hosts_result_waits_for_it(sshd: Any, tmp_path: Path) -> None:
    """A call naming a call on another host: a second wave, after that call's reply, with its result."""
    from pytest_san import SanError, WsaError

    hosts = [sshd.host_config(name=name, engine="emulator", loopback=True,
                              extra={"san_remote_tmp": str(tmp_path)}) for name in ("lab1", "lab2")]
    backend = HilBackend(hosts)
    try:
        one, two = (agent.nodes[0] for agent in backend.agents)
        p, q = one.default_process, two.default_process
        sock, _ = backend.connect_sockets(q, two.spawn_process())
        before = backend.round_trips()
        with batch(backend) as b:
            foreign = b.call(p.alloc, 8)
            made = [foreign, b.call(two.provider.register_memory, sock, foreign.ref, Access.READ), b.call(q.alloc, 8)]
        spent = {h: n - before[h] for h, n in backend.round_trips().items()}
        assert spent == {"lab1": 1, "lab2": 1}  # lab2's calls both in the second wave, in order
        assert made[0].error is None and made[2].error is None and foreign.value.process is p
        error = made[1].error
        assert isinstance(error, SanError) and error.code is WsaError.WSAEFAULT  # another host's memory
        two.provider.close_socket(sock)
    finally:
        backend.close()


def test_a_call_behind_a_barrier_follows_every_host_s_calls(sshd: Any, tmp_path: Path) -> None:
    """``Batch.barrier``: a call on lab2 behind it is sent only once lab1's calls before it have answered (a
    second wave: the model's reads of one host after an operation waited for on another); lab1's own call behind
    it stays in the first wave, after its calls in the same write."""
    from hil.controller.together import Together
    from pytest_san import Status

    hosts = [sshd.host_config(name=name, engine="emulator", loopback=True,
                              extra={"san_remote_tmp": str(tmp_path)}) for name in ("lab1", "lab2")]
    backend = HilBackend(hosts)
    try:
        one, two = (agent.nodes[0] for agent in backend.agents)
        a, b = backend.connect_sockets(one.default_process, one.spawn_process())
        src, dst, other = a.process.alloc(8), b.process.alloc(8), two.default_process.alloc(8)
        src.write(b"written!")
        handle = one.provider.register_memory(a, src, Access.READ)
        desc = one.provider.register_rdma_memory(b, dst, Access.WRITE)
        before = backend.round_trips()
        with batch(backend) as bt:
            op = bt.call(one.provider.rdma_write, a, [(src, handle)], desc, 0)
            waited = bt.call(wait_for, op.ref, 10.0)
            bt.barrier()
            there, here = bt.call(other.read), bt.call(dst.read)
        spent = {h: n - before[h] for h, n in backend.round_trips().items()}
        again = Together.of(bt.calls)  # the same calls made again, to see the wave each went in
        assert again is not None
        again.make()
        assert again.waves == [0, 0, 1, 0]
        assert spent == {"lab1": 1, "lab2": 1}
        assert waited.value.status is Status.SUCCESS
        assert here.value == b"written!" and there.value == bytes(8)
        unfenced = Batch(backend)
        unfenced.call(one.provider.rdma_write, a, [(src, handle)], desc, 0)
        unfenced.call(other.read)
        unfenced_made = Together.of(unfenced.calls)  # made here, not by the batch
        assert unfenced_made is not None
        unfenced_made.make()
        assert unfenced_made.waves == [0, 0]
        one.provider.close_socket(a)
    finally:
        backend.close()
