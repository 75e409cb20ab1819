"""What the SAN fixtures cost on the remote path, in agent round trips (issue 11): at most 3 per host per test,
closing the test's connections, the leak check and the reset included. Counted, not timed: the bound holds on
any machine. Over a real OpenSSH server (engine emulator, loopback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hil.controller.backend import HilBackend
from hil.inventory import HostConfig
from pytest_san import Access, Switch
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


def test_questions_asked_together_cost_one_round_trip_and_answer_as_asked_alone(sshd_host: HostConfig) -> None:
    """HilBackend.answering (the model's checks): socket states, registrations, bytes, proxy counts and
    completions in one round trip; the answers (errors included) are those the objects give alone."""
    from pytest_san import SanError, Status, WsaError
    from pytest_san.protocols import Question

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

        def ask() -> list[object]:
            answers: list[object] = []
            for sock in (a_sock, b_sock, closed):
                answers += [sock.connected, sock.closed]
            not_a_socket: Any = 424242
            for sock in (a_sock, closed, not_a_socket):
                try:
                    answers.append(sorted((r.kind, r.length, int(r.access)) for r in provider.registrations(sock)))
                except SanError as exc:
                    answers.append(exc.code)
            return [*answers, buf.read(), proxy.live_allocations(), recv.done()]

        alone = ask()
        questions: list[Question] = [
            *[(s, "connected", ()) for s in (a_sock, b_sock, closed)],
            *[(provider, "registrations", (s,)) for s in (a_sock, closed, 424242)],
            (buf, "read", ()), (proxy, "live_allocations", ()), (recv, "done", ())]
        before = backend.round_trips()[sshd_host.name]
        with backend.answering(questions):
            together = ask()
        assert backend.round_trips()[sshd_host.name] - before == 1
        assert together == alone
        assert alone[:6] == [True, False, True, False, False, True] and alone[-1] is False
        assert alone[6] == [("memory", 64, int(Access.READ))] and alone[8] == WsaError.WSAENOTSOCK
        provider.send(a_sock, [(buf.view(0, 8), provider.register_memory(a_sock, buf, Access.READ))])
        assert recv.wait(10).status is Status.SUCCESS  # answers asked together are not kept after the block
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
    """HilBackend.together: each call's outcome is its own (a failure does not stop or spoil the others) and
    a failed build of a connection's end releases what the others built (all or nothing)."""
    from pytest_san import SanError, WsaError
    from pytest_san.contract import QUEUE_DEPTH

    backend = HilBackend([sshd_host])
    try:
        node = backend.nodes[0]
        p = node.default_process
        a, _ = backend.connect_sockets(p, node.spawn_process())
        buf = p.alloc(64)
        before = backend.round_trips()[sshd_host.name]
        outcomes = backend.together([(node.provider, "register_memory", (a, buf, Access.READ)),
                                     (node.provider, "register_memory", (a, buf, 7)),
                                     (p, "alloc", (32,))])
        assert backend.round_trips()[sshd_host.name] - before == 1
        (ok0, handle), (ok1, error), (ok2, more) = outcomes
        assert ok0 and isinstance(handle, int) and not ok1 and ok2
        assert isinstance(error, SanError) and error.code is WsaError.WSAEINVAL
        assert more.length == 32 and more.process is p  # type: ignore[attr-defined]
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
    """A proxy's allocate and a free naming it (pytest_san.together.Earlier) in one round trip; a free of what
    is already free fails there as it does alone, and the proxy's count ends where it began."""
    from pytest_san import WsaError
    from pytest_san.together import Earlier, one_by_one

    backend = HilBackend([sshd_host])
    try:
        proxy = backend.nodes[0].proxy
        start = proxy.live_allocations()
        calls: list[Any] = [(proxy, "allocate", (4096,)), (proxy, "free", (Earlier(0),)),
                            (proxy, "allocate", (8192,)), (proxy, "free", (Earlier(2),)),
                            (proxy, "free", (Earlier(0),))]
        before = backend.round_trips()[sshd_host.name]
        made = backend.together(calls)
        assert backend.round_trips()[sshd_host.name] - before == 1
        alone = one_by_one(calls)
        assert [(ok, type(value)) for ok, value in made] == [(ok, type(value)) for ok, value in alone]
        assert [ok for ok, _ in made] == [True, True, True, True, False]
        assert made[0][1].length >= 4096 and made[2][1].length >= 8192
        assert made[4][1].code is alone[4][1].code is WsaError.WSAEINVAL  # type: ignore[attr-defined]
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
        with backend.answering([(p, "alive", ()), (q, "alive", ())]):
            answers = [p.alive, q.alive]
        assert backend.round_trips()[sshd_host.name] - before == 1
        assert answers == [True, False] == [p.alive, q.alive]
    finally:
        backend.close()


@pytest.fixture
def sshd_host(sshd: object, tmp_path: Path) -> HostConfig:
    host: HostConfig = sshd.host_config(name="lab1", engine="emulator", loopback=True)  # type: ignore[attr-defined]
    return host


def _chain(backend: object, node: Any, sock: Any, fail: bool = False) -> list[Any]:
    """alloc, its write, a registration of it, a receive into it, a wait: each names what an earlier one returned."""
    from pytest_san.together import Earlier

    p, provider = node.default_process, node.provider
    return [(p, "alloc", (16,)),
            (provider, "getsockopt", (sock, 0x700D)),
            (provider, "register_memory", (sock, Earlier(0), 7 if fail else Access.WRITE)),
            (provider, "recv", (sock, [(Earlier(0), Earlier(2))])),
            (Earlier(3), "done", ()),
            (Earlier(3), "wait", (0.5,)),
            (sock, "connected", ()),
            (provider, "registrations", (sock,))]


def _shown(outcomes: list[Any]) -> list[Any]:
    """Outcomes as comparable values: errors by type and code, buffers by length, registrations by fields."""
    out: list[Any] = []
    for ok, value in outcomes:
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
    """Earlier(i) in HilBackend.together: an allocation, a registration of it, a receive into it and waits for
    that receive, one round trip in all; the outcomes are those of the same calls made one by one on the
    emulator in-process (a call naming a failed one fails the same, unmade)."""
    from pytest_san.emulator import EmulatorBackend
    from pytest_san.together import one_by_one

    alone = EmulatorBackend()
    a, _ = alone.connect_sockets(alone.nodes[0].default_process, alone.nodes[0].spawn_process())
    expected = _shown(one_by_one(_chain(alone, alone.nodes[0], a, fail)))
    backend = HilBackend([sshd_host])
    try:
        node = backend.nodes[0]
        sock, _ = backend.connect_sockets(node.default_process, node.spawn_process())
        before = backend.round_trips()[sshd_host.name]
        outcomes = backend.together(_chain(backend, node, sock, fail))
        assert backend.round_trips()[sshd_host.name] - before == 1
        assert _shown(outcomes) == expected
        if fail:
            assert [ok for ok, _ in outcomes[2:6]] == [False] * 4
            assert all(value is outcomes[2][1] for _, value in outcomes[3:6])  # the same failure, unmade
        else:
            assert expected[4:6] == [False, ("TimeoutError", None)]  # nothing sent: the receive waits
        node.provider.close_socket(sock)
        assert backend.leaks() == []
    finally:
        backend.close()


def test_a_call_naming_another_hosts_result_waits_for_it(sshd: Any, tmp_path: Path) -> None:
    """An Earlier naming a call on another host: a second wave, after that call's reply, with its result."""
    from pytest_san import SanError, WsaError
    from pytest_san.together import Earlier

    hosts = [sshd.host_config(name=name, engine="emulator", loopback=True,
                              extra={"san_remote_tmp": str(tmp_path)}) for name in ("lab1", "lab2")]
    backend = HilBackend(hosts)
    try:
        one, two = (agent.nodes[0] for agent in backend.agents)
        p, q = one.default_process, two.default_process
        sock, _ = backend.connect_sockets(q, two.spawn_process())
        before = backend.round_trips()
        outcomes = backend.together([(p, "alloc", (8,)),
                                     (two.provider, "register_memory", (sock, Earlier(0), Access.READ)),
                                     (q, "alloc", (8,))])
        spent = {h: n - before[h] for h, n in backend.round_trips().items()}
        assert spent == {"lab1": 1, "lab2": 1}  # lab2's calls both in the second wave, in order
        (ok0, foreign), (ok1, error), (ok2, _) = outcomes
        assert ok0 and ok2 and not ok1 and foreign.process is p  # type: ignore[attr-defined]
        assert isinstance(error, SanError) and error.code is WsaError.WSAEFAULT  # another host's memory
        two.provider.close_socket(sock)
    finally:
        backend.close()
