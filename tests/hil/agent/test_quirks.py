"""The verbs engine's kernel workarounds (hil/agent/engines/verbs/quirks.py): which driver and kernel get each,
and the override a reproducer uses (``san-hil lab reproduce``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hil.agent.engines.verbs import quirks
from hil.agent.engines.verbs.quirks import WORKAROUNDS, Workaround, applied, driver_of, kernel_series


def test_kernel_series() -> None:
    assert kernel_series("6.12.117+deb13-amd64") == (6, 12)
    assert kernel_series("6.1.0-57-amd64") == (6, 1)
    assert kernel_series("weird") is None


def test_the_driver_is_what_the_device_says_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for device, desc in {"rxe0": "rxe\n", "siw0": "Software iWARP stack\n", "mlx5_0": "host1 HCA-1\n"}.items():
        (tmp_path / device).mkdir()
        (tmp_path / device / "node_desc").write_text(desc)
    monkeypatch.setattr(quirks, "SYSFS", str(tmp_path))
    assert [driver_of(d) for d in ("rxe0", "siw0", "mlx5_0", "absent")] == ["rxe", "siw", None, None]


def test_a_workaround_applies_to_its_driver_on_the_kernels_that_need_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = Workaround("x-fixed", "siw", "a bug", "a workaround", "R14", fixed_in=(6, 12))
    monkeypatch.setattr(quirks, "WORKAROUNDS", (*WORKAROUNDS, fixed))
    names = lambda ws: [w.name for w in ws]  # noqa: E731
    siw = [w.name for w in WORKAROUNDS if w.driver == "siw" and w.fixed_in is None]
    assert names(applied("siw", "6.1.0-57-amd64", "")) == [*siw, "x-fixed"]
    assert names(applied("siw", "6.12.117+deb13-amd64", "auto")) == siw  # fixed there
    # rxe-flushed-local-error is a 6.12 bug: 6.1 does not get its workaround
    assert names(applied("rxe", "6.1.0-57-amd64", "")) == ["rxe-zero-length-read", "rxe-local-op-replayed"]
    assert names(applied("rxe", "6.12.117+deb13-amd64", "")) == ["rxe-zero-length-read", "rxe-flushed-local-error",
                                                                    "rxe-local-op-replayed"]
    assert names(applied("mlx5", "6.1.0-57-amd64", "")) == []
    assert names(applied("siw", "6.12.117+deb13-amd64", "all")) == [*siw, "x-fixed"]
    assert names(applied("siw", "6.1.0-57-amd64", "none")) == []
    assert names(applied("siw", "6.1.0-57-amd64", "x-fixed, other")) == ["x-fixed"]
    monkeypatch.setenv(quirks.ENV, "none")
    assert names(applied("siw", "6.1.0-57-amd64")) == []


def test_a_workaround_from_a_kernel_on() -> None:
    w = Workaround("x", "rxe", "a bug", "a workaround", "R14", broken_from=(6, 12), fixed_in=(6, 15))
    assert [w.needed(s) for s in ((6, 1), (6, 12), (6, 14), (6, 15), None)] == [False, True, True, False, True]


def test_every_workaround_says_what_it_is_for() -> None:
    assert len({w.name for w in WORKAROUNDS}) == len(WORKAROUNDS)
    for w in WORKAROUNDS:
        assert w.driver in ("rxe", "siw") and w.bug and w.does


def test_each_workaround_was_retested_on_every_kernel_the_lab_boots() -> None:
    """What its reproducer found decides where it applies: a kernel it found the bug on gets it, one it found the
    bug gone on does not, unless ``kept`` says why the engine still applies it."""
    for w in WORKAROUNDS:
        assert [series for series, _ in w.retested] == list(quirks.KERNELS), w.name
        for series, verdict in w.retested:
            assert verdict in (quirks.THERE, quirks.GONE), w.name
            if verdict == quirks.THERE:
                assert w.broken(series) and w.needed(series), (w.name, series)
            else:
                assert w.kept or not w.needed(series), (w.name, series)


def test_a_kept_workaround_applies_where_its_bug_is_gone() -> None:
    w = Workaround("x", "rxe", "a bug", "a workaround", "R14", fixed_in=(6, 12), kept="the NIC skips a check")
    assert [(w.broken(s), w.needed(s)) for s in ((6, 1), (6, 12))] == [(True, True), (False, True)]
