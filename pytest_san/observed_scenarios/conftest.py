"""The fixture of the observed scenarios: rsockets processes on the backend's nodes, killed after the test;
rsockets' declared deviations (``deviations.py``), on a backend that observes it; and what a deviating scenario
saw, added to its reason (a hang's deadline, CPU share and what the kernel held), so the verdict says what
happened on this run and not only what was declared."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import pytest

from pytest_san import Backend, Deviation
from pytest_san.observed import ObservedProcess, Observing, RsocketsProcess
from pytest_san.plugin.hooks import DEVIATION_ATTR

from .deviations import RSOCKETS


def pytest_san_deviations(config: pytest.Config, backend: Backend) -> Iterable[Deviation] | None:
    """rsockets' deviations, where its scenarios run: elsewhere they are skipped and would show none."""
    if isinstance(backend, Observing) and "rsockets" in backend.capabilities:
        return RSOCKETS
    return None


SAW = 700  # characters of what a deviating scenario saw, in its reason


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: after the deviations plugin made it deviating
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    declared = getattr(report, DEVIATION_ATTR, None)
    if declared is not None and call.excinfo is not None:
        saw = " ".join(str(call.excinfo.value).split())[:SAW]
        vars(report)[DEVIATION_ATTR] = f"{declared}; this run: {saw}"
        report.wasxfail = f"{report.wasxfail}; this run: {saw}"
    return report


@pytest.fixture
def rsockets(san_backend: Backend) -> Iterator[Callable[[int], RsocketsProcess]]:
    """``rsockets(i)``: a new rsockets process under observation on node ``i`` (of the first two)."""
    if not isinstance(san_backend, Observing):
        pytest.skip(f"the {getattr(san_backend, 'name', type(san_backend).__name__)} backend runs no program under "
                    "observation (spawn_observed): rsockets is judged on the hil backend's verbs hosts")
    backend: Observing = san_backend
    nodes = san_backend.nodes
    spawned: list[ObservedProcess] = []

    def spawn(index: int) -> RsocketsProcess:
        process = backend.spawn_observed(nodes[min(index, len(nodes) - 1)], "rsockets")
        spawned.append(process)
        return RsocketsProcess(process)

    yield spawn
    for process in spawned:
        process.kill()
