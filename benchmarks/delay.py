"""Benchmark only: a fixed delay on every controller-to-agent round trip, as a lab host that far away adds.

On a TCG lab on this machine a round trip is cheap next to the guests' own work; a real lab host 20 ms away
adds that much to each. This makes the controller's side of a round trip wait: an agent's replies are read no
sooner than ``delay`` seconds after the last request written to it, so requests written to several agents at
once (a round trip to every host) pay the delay once, as they would on a network.

As a pytest plugin (``-p delay``, this directory on PYTHONPATH; ``SAN_BENCH_DELAY_MS``: the delay) in a suite
run of any tree of this project, or ``install(seconds)`` in-process (``benchmarks/lab.py``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

ENV = "SAN_BENCH_DELAY_MS"


def install(delay: float) -> None:
    """Delay every round trip of every AgentClient of this process by ``delay`` seconds."""
    try:
        from hil.controller.client import AgentClient
    except ImportError:  # older trees: hil/client.py
        from hil.client import AgentClient  # type: ignore[no-redef,import-not-found,unused-ignore]
    if getattr(AgentClient, "_bench_delay", None) is not None:
        AgentClient._bench_delay = delay  # type: ignore[attr-defined]
        return
    AgentClient._bench_delay = delay  # type: ignore[attr-defined]

    def wait_for(client: Any) -> None:
        sent = getattr(client, "_bench_sent", None)
        if sent is not None:
            late = sent + AgentClient._bench_delay - time.monotonic()  # type: ignore[attr-defined]
            if late > 0:
                time.sleep(late)
            client._bench_sent = None

    if hasattr(AgentClient, "collect"):
        send, collect = AgentClient.send, AgentClient.collect

        def delayed_send(self: Any, *args: Any, **kwargs: Any) -> Any:
            self._bench_sent = time.monotonic()
            return send(self, *args, **kwargs)

        def delayed_collect(self: Any, *args: Any, **kwargs: Any) -> Any:
            wait_for(self)
            return collect(self, *args, **kwargs)

        AgentClient.send = delayed_send  # type: ignore[method-assign]
        AgentClient.collect = delayed_collect  # type: ignore[method-assign]
    else:  # every request waits for its reply
        call = AgentClient.call

        def delayed_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            self._bench_sent = time.monotonic()
            wait_for(self)
            return call(self, *args, **kwargs)

        AgentClient.call = delayed_call  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    milliseconds = float(os.environ.get(ENV) or 0)
    if milliseconds > 0:
        install(milliseconds / 1000)
