"""Every pair of call-time faults, for every SPI call, against the reference order (pytest_san.spi.checks).

The faults each argument can carry are the suite's (``pytest_san.scenarios.faults``, generated from the reference
order); the cases here are every fault alone and every pair of faults in two different slots (the cross product). Any
backend with two nodes runs them (``run_pairs``): the emulator, the hil backend with a local agent, a lab. A
backend that follows the reference order answers every case as the table says, so two such backends answer every
case alike; ``answers`` keeps each case's answer for comparing them call by call.
"""

from __future__ import annotations

from pytest_san.scenarios.faults import NOT_MADE, SLOTS, Case, Fault, World, answer_of, by_call, cases, sample, want
from pytest_san.scenarios.faults import run_cases as run_pairs

__all__ = ["NOT_MADE", "SLOTS", "Case", "Fault", "World", "answer_of", "by_call", "cases", "run_pairs", "sample",
           "want"]
