"""The reference model: random SPI sequences checked, step by step, against a model written from CONTRACT.md.

``pytest --pyargs pytest_san.model [--san-backend hil --san-inventory lab.yaml]`` model-checks the
selected backend (test_model.py); ``--san-model-differential`` also replays every sequence on a fresh
emulator and compares the two. The parts, in the order a step flows through them:

* ``steps``: what a sequence is made of (SPI calls described by index, so any backend can replay them);
* ``generate``: seeded random steps drawn from the model's state;
* ``reference`` and ``transfers``: the model (what a provider must answer, and how the state moves);
  ``state``: its records; ``alternatives``: where a backend may answer otherwise, and why;
* ``world`` and ``execute``: the backend's processes and buffers, each step called through the public
  API and checked against the model;
* ``run``, ``shrink``, ``divergence``: budget and seeds, shrinking a failing sequence, and the report.
"""

from ..spi.protocols import ModelBudget
from .alternatives import ALTERNATIVES, Alternative
from .run import ModelRun, Summary

__all__ = ["ALTERNATIVES", "Alternative", "ModelBudget", "ModelRun", "Summary"]
