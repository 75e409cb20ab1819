"""The fixture of the observed scenarios: rsockets processes on the backend's nodes, killed after the test; and
rsockets' declared deviations (``deviations.py``), on a backend that observes it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import pytest

from pytest_san import Backend, Deviation
from pytest_san.observed import ObservedProcess, Observing, RsocketsProcess

from .deviations import RSOCKETS


def pytest_san_deviations(config: pytest.Config, backend: Backend) -> Iterable[Deviation] | None:
    """rsockets' deviations, where its scenarios run: elsewhere they are skipped and would show none."""
    if isinstance(backend, Observing) and "rsockets" in backend.capabilities:
        return RSOCKETS
    return None


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
