"""Benchmark only: the seconds a model run spends replaying its regressions, so that trees whose cost lines
count them differently are compared per sequence alike.

Every run of the reference model replays the shrunk sequences of past divergences (``pytest_san/model/
regressions.py``) before its own sequences: a fixed cost per run, not per sequence. As a pytest plugin
(``-p replaying``, this directory on PYTHONPATH; ``SAN_BENCH_REPLAYING_OUT``: where to write
``{"seconds": ...}``) it times ``ModelRun._regression``, which every tree measured has.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

ENV = "SAN_BENCH_REPLAYING_OUT"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get(ENV)
    if not out:
        return
    from pytest_san.model.run import ModelRun

    replay = ModelRun._regression
    spent = [0.0]

    def timed(self: Any, regression: Any) -> None:
        began = time.perf_counter()
        try:
            replay(self, regression)
        finally:
            spent[0] += time.perf_counter() - began
            Path(out).write_text(json.dumps({"seconds": spent[0]}))

    ModelRun._regression = timed  # type: ignore[method-assign]
