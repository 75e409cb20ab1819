"""benchmarks/unbatched.py, what ``benchmarks/lab.py --per-use`` measures each use of calls made together with:
a use turned off costs its round trips and answers as before; the others keep theirs. Counted over a real
OpenSSH server (engine emulator, loopback), not timed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hil.controller.backend import HilBackend
from hil.inventory import HostConfig
from pytest_san import Access, Switch
from pytest_san import batch as batch_module

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import unbatched  # type: ignore[import-not-found]  # benchmarks/unbatched.py, on the path above


@pytest.fixture
def sshd_host(sshd: object) -> HostConfig:
    host: HostConfig = sshd.host_config(name="lab1", engine="emulator", loopback=True)  # type: ignore[attr-defined]
    return host


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``unbatched.install`` replaces, put back after the test."""
    monkeypatch.setattr(batch_module, "_batches", batch_module._batches)
    monkeypatch.setattr(HilBackend, "end_test", HilBackend.end_test)


def _connect_and_end(host: HostConfig) -> tuple[int, int, list[tuple[str, str]], bytes]:
    """Round trips of a switch's connect and of the test's end after it (which must leave nothing), the
    connection's trace before that end, and what crossed it. (What close deregisters itself depends on which
    operations were done when it asked; the provider releases the rest, R11.)"""
    backend = HilBackend([host])
    try:
        switch = Switch(backend)
        node = backend.nodes[0]
        assert node.default_process.alive  # known before the connect, as after a test's reset
        peer = node.spawn_process()
        before = backend.round_trips()[host.name]
        conn = switch.connect(peer=peer)
        connecting = backend.round_trips()[host.name] - before
        conn.local.send(b"one by one")
        got = conn.remote.recv(10)
        buf = conn.local.process.alloc(4096)
        conn.local.provider.register_memory(conn.local.socket, buf, Access.READ)  # released by close_socket
        trace = list(conn.trace)
        before = backend.round_trips()[host.name]
        assert backend.end_test(switch.close_all) == ([], [])
        ending = backend.round_trips()[host.name] - before
        return connecting, ending, trace, got
    finally:
        backend.close()


def test_a_use_made_one_call_at_a_time_costs_round_trips_and_answers_the_same(sshd_host: HostConfig,
                                                                              restored: None) -> None:
    together = _connect_and_end(sshd_host)
    unbatched.install({"connect"})
    alone = _connect_and_end(sshd_host)
    assert together[0] == 3 and alone[0] > together[0]  # the sockets, then the regions, then the receives
    assert alone[1] == together[1] == 2  # the end of a test still pipelined
    assert alone[2:] == together[2:]
    unbatched.install({"end"})
    ended = _connect_and_end(sshd_host)
    assert ended[1] > together[1] and ended[2:] == together[2:]


def test_a_batch_is_told_by_where_it_is_made() -> None:
    def made_in(module: str, function: str) -> str | None:
        code = compile(f"def {function}():\n    return sys._getframe()\n", module, "exec")
        scope: dict[str, Any] = {"__name__": module, "sys": sys}
        exec(code, scope)
        use: str | None = unbatched.use_of(scope[function]())
        return use

    assert made_in("pytest_san.switch.connection", "_build") == "connect"
    assert made_in("pytest_san.switch.connection", "progress") == "progress"
    assert made_in("pytest_san.switch.endpoint", "_batch") == "progress"
    assert made_in("pytest_san.scenarios.support", "connect_pair") == "scenarios"
    assert made_in("pytest_san.model.world", "looks") == "model"
    assert made_in("tests.elsewhere", "anything") is None


def test_an_unknown_use_is_a_usage_error_naming_the_uses(restored: None) -> None:
    with pytest.raises(pytest.UsageError, match=r"SAN_BENCH_UNBATCHED: no such use \['conect'\]; the uses are "
                                                r"connect, progress, scenarios, model, end"):
        unbatched.install({"conect"})
