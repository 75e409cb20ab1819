"""Benchmark only: chosen uses of calls made together made one call at a time instead, to measure what each use
saves (``benchmarks/lab.py --per-use``).

As a pytest plugin (``-p unbatched``, this directory on PYTHONPATH) in a suite run of this tree;
``SAN_BENCH_UNBATCHED``: a comma-separated list of the uses below. A use is told by where its batch is made
(``pytest_san.batch``'s caller), so nothing in the package knows about this:

- ``connect``: the switch building a connection, both ends' regions, registrations and receives
  (``pytest_san/switch/connection.py``, ``Connection._build``);
- ``progress``: the switch moving data, its endpoints' batches and ``done_ahead`` (the rest of
  ``pytest_san/switch/``);
- ``scenarios``: the scenarios' own batches (``pytest_san/scenarios/``);
- ``model``: the reference model's checks after each step and its connects (``pytest_san/model/``);
- ``end``: the end of a test, ``HilBackend.end_test`` (closing, the leak check and the reset pipelined, at most
  two round trips a host), made as the calls themselves: ``close()``, ``leaks()``, ``reset()``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

ENV = "SAN_BENCH_UNBATCHED"
USES = ("connect", "progress", "scenarios", "model", "end")


def use_of(frame: FrameType | None) -> str | None:
    """The use a batch made from ``frame`` (or a caller of it) serves: the first frame outside
    ``pytest_san.batch`` says."""
    while frame is not None and frame.f_globals.get("__name__") == "pytest_san.batch":
        frame = frame.f_back
    if frame is None:
        return None
    module = str(frame.f_globals.get("__name__", ""))
    if module == "pytest_san.switch.connection" and frame.f_code.co_name == "_build":
        return "connect"
    for prefix, use in (("pytest_san.switch.", "progress"), ("pytest_san.scenarios.", "scenarios"),
                        ("pytest_san.model.", "model")):
        if module.startswith(prefix):
            return use
    return None


def install(off: set[str]) -> None:
    """Make the batches of the uses in ``off`` one call at a time, and with ``end`` the end of a test too."""
    unknown = off - set(USES)
    if unknown:
        raise pytest.UsageError(f"{ENV}: no such use {sorted(unknown)}; the uses are {', '.join(USES)}")
    from pytest_san import batch

    batches: Callable[[object], bool] = batch._batches

    def chosen(backend: object) -> bool:
        return batches(backend) and use_of(sys._getframe(1)) not in off

    batch._batches = chosen  # type: ignore[assignment]  # a bool where a TypeGuard was: the same at run time
    if "end" in off:
        from hil.controller.backend import HilBackend

        def end_test(self: HilBackend, close: Callable[[], None] | None = None) -> tuple[list[Any], list[Exception]]:
            errors: list[Exception] = []
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    errors.append(exc)
            try:
                leaks = self.leaks()
            finally:
                self.reset()
            return leaks, errors

        HilBackend.end_test = end_test  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    off = {use.strip() for use in os.environ.get(ENV, "").split(",") if use.strip()}
    if off:
        install(off)
