"""The reference model: random SPI sequences checked, step by step, against a model written from CONTRACT.md.

``pytest --pyargs pytest_san.model [--san-backend hil --san-inventory lab.yaml]`` model-checks the
selected backend (test_model.py); ``--san-model-differential`` also replays every sequence on a fresh
emulator and compares the two. As hypothesis's stateful testing keeps the rules and the invariants apart
from the engine that runs them, each part holds one idea; in the order a step flows through them:

* ``steps``: what a sequence is made of (seven types of SPI step, naming things by index, so any backend
  can replay them); ``generate``: seeded random steps drawn from the model's state;
* ``kinds``: what each type of step is to every other part, one row each (the one place a step's type is
  dispatched on);
* ``reference`` and ``transfers``: the model (what a provider must answer, and how the state moves);
  ``state``: its records; ``alternatives``: where a backend may answer otherwise, and why, with the race of
  one that acts on its own between the steps;
* ``invariants``: the checks, functions from the model and what was read of the backend to problems;
* ``execute``: the engine (``Side``), each step made through the public API and judged; ``handles``,
  ``racing`` and ``world``: what it asks of the backend;
* ``run``, ``shrink``, ``divergence``, ``naming``: budget and seeds, shrinking a failing sequence, and the
  report; ``rules`` and ``faults``: which rules a divergence breaks.
"""

from ..spi.protocols import ModelBudget
from .alternatives import ALTERNATIVES, Alternative
from .run import ModelRun, Summary

__all__ = ["ALTERNATIVES", "Alternative", "ModelBudget", "ModelRun", "Summary"]
