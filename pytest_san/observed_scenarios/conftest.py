"""The fixtures of the observed scenarios: rsockets processes, and NVMe-oF's kernel drivers and rogue target, on the
backend's nodes, killed after the test (which undoes what they made); the declared deviations (``deviations.py``)
of what a backend observes; and what a deviating scenario
saw, added to its reason (a hang's deadline, CPU share and what the kernel held), so the verdict says what
happened on this run and not only what was declared."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import pytest

from pytest_san import Backend, Deviation
from pytest_san.observed import NvmeFabric, ObservedProcess, Observing, RogueTarget, RsocketsProcess
from pytest_san.plugin.hooks import DEVIATION_ATTR

from .deviations import NVME, NVME_POOL_KEYS, RSOCKETS


def pytest_san_deviations(config: pytest.Config, backend: Backend) -> Iterable[Deviation] | None:
    """rsockets' and NVMe-oF's deviations, where their scenarios run: elsewhere they are skipped and would show
    none. The pool key's comes back only where requests use pool MRs (``register_always=Y``)."""
    if not isinstance(backend, Observing):
        return None
    declared: list[Deviation] = []
    if "rsockets" in backend.capabilities:
        declared += RSOCKETS
    if "nvme_rdma" in backend.capabilities:
        declared += NVME
        if config.getoption("san_nvme_register_always") == "Y":
            declared += NVME_POOL_KEYS
    return tuple(declared) or None


def record(request: pytest.FixtureRequest, **values: object) -> None:
    """What a scenario saw, as a ``user_properties`` entry ("observed", JSON) that the reports carry."""
    request.node.user_properties.append(("observed", json.dumps(values, default=str)))


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


class Nvme:
    """What an NVMe-oF scenario spawns: ``fabric(i)`` (the kernel's target or host on node ``i``), ``rogue(i)`` (our
    target on node ``i``), and the run's ``register_always``; every process is killed after the test, and its
    cleanup disconnects, removes the target and unloads what it loaded."""

    def __init__(self, backend: Observing, nodes: list[Any], register_always: str) -> None:
        self._backend = backend
        self._nodes = nodes
        self.register_always = register_always
        self.spawned: list[ObservedProcess] = []

    def _spawn(self, index: int, program: str) -> ObservedProcess:
        process = self._backend.spawn_observed(self._nodes[min(index, len(self._nodes) - 1)], program)
        self.spawned.append(process)
        return process

    def fabric(self, index: int) -> NvmeFabric:
        return NvmeFabric(self._spawn(index, "nvme"))

    def rogue(self, index: int) -> RogueTarget:
        return RogueTarget(self._spawn(index, "nvme-rogue"))


@pytest.fixture
def nvme(san_backend: Backend, request: pytest.FixtureRequest) -> Iterator[Nvme]:
    """The NVMe-oF processes of one scenario (``Nvme``)."""
    if not isinstance(san_backend, Observing):
        pytest.skip(f"the {getattr(san_backend, 'name', type(san_backend).__name__)} backend runs no program under "
                    "observation (spawn_observed): NVMe-oF is judged on the hil backend's verbs hosts")
    if len(san_backend.nodes) < 2:
        pytest.skip("NVMe-oF's target and host need two nodes")
    spawned = Nvme(san_backend, list(san_backend.nodes), request.config.getoption("san_nvme_register_always"))
    yield spawned
    for process in reversed(spawned.spawned):  # the host first: it disconnects before its target goes
        process.kill()
