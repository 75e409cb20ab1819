"""pytest_san/pacing.py: the pause a polling loop takes after a round in which nothing moved."""

from __future__ import annotations

import pytest

from pytest_san import pacing


def test_the_pause_doubles_while_nothing_moves_and_ends_when_something_does(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(pacing.time, "sleep", slept.append)
    pace = pacing.Backoff(first=0.001, most=0.005)
    for moved in (False, False, False, False, True, True, False):
        pace.after(moved)
    assert slept == [0.001, 0.002, 0.004, 0.005, 0.001]


def test_a_connection_waiting_on_the_emulator_pauses_only_when_nothing_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch's wait loop: a receive of bytes never sent times out, pausing between idle rounds rather
    than asking again at once (on a lab each round is a round trip)."""
    from pytest_san.spi.emulator import EmulatorBackend
    from pytest_san.switch import Switch

    backend = EmulatorBackend()
    try:
        conn = Switch(backend).connect(backend.nodes[0].default_process, backend.nodes[1].default_process)
        slept: list[float] = []
        monkeypatch.setattr(pacing.time, "sleep", slept.append)
        with pytest.raises(TimeoutError):
            conn.run_until(lambda: False, 0.05, "nothing")
        assert slept and slept[:3] == [0.0002, 0.0004, 0.0008]
        conn.close()
    finally:
        backend.close()
