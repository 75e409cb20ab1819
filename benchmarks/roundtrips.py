"""A pytest plugin counting agent round trips per test phase on the hil backend (``benchmarks/lab.py``).

Loaded with ``-p roundtrips`` (this directory on PYTHONPATH) into a suite run of any tree of this project,
old or new: a controller whose ``AgentClient`` counts round trips itself (``round_trips``, pipelined requests
answered together once) is read as it is; an older one, where every request waits for its reply, gets
``call`` counted. At the end it writes, to ``$SAN_ROUND_TRIPS_OUT`` (JSON)::

    {"tests": {nodeid: {"setup": {host: n}, "call": {...}, "teardown": {...}, "fixtures": {...}}},
     "hosts": [...]}

``fixtures`` is what the SAN fixtures cost, as the plugin records it on the item (``san_round_trips`` in
``user_properties``, trees that have it): setup and teardown, per host.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

_results: dict[str, dict[str, Any]] = {}
_hosts: set[str] = set()


def pytest_configure(config: pytest.Config) -> None:
    try:
        from hil.controller.client import AgentClient
    except ImportError:
        try:  # older trees: hil/client.py
            from hil.client import AgentClient  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ImportError:
            return
    if hasattr(AgentClient, "collect"):
        return  # it counts round trips itself
    original = AgentClient.call

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.round_trips = getattr(self, "round_trips", 0) + 1
        return original(self, *args, **kwargs)

    AgentClient.call = call  # type: ignore[method-assign]


def _counts(config: pytest.Config) -> dict[str, int]:
    try:
        from pytest_san.plugin.hooks import created_backend
    except ImportError:
        return {}
    backend = created_backend(config)
    out: dict[str, int] = {}
    for agent in getattr(backend, "agents", []):
        # Per Agent: an agent replaced after it died starts from 0 (older trees); the new tree keeps a total.
        count = getattr(agent, "round_trips", None)
        out[agent.host.name] = count if isinstance(count, int) else int(getattr(agent.client, "round_trips", 0))
    return out


def _phase(item: pytest.Item, phase: str) -> Iterator[None]:
    before = _counts(item.config)
    yield
    after = _counts(item.config)
    _hosts.update(after)
    _results.setdefault(item.nodeid, {})[phase] = {h: n - before.get(h, 0) for h, n in after.items()}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _phase(item, "teardown")
    for name, value in item.user_properties:
        if name == "san_round_trips":
            _results.setdefault(item.nodeid, {})["fixtures"] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    out = os.environ.get("SAN_ROUND_TRIPS_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({"tests": _results, "hosts": sorted(_hosts)}, f, indent=1)
