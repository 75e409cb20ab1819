"""Issue 37's fourth held-out set of planted bugs and legal variants, written from the documentation alone
(README.md, docs/, the contract (pytest_san/CONTRACT.md), pytest_san/spi/protocols.py, the example switch and
pytest_san/mutants/wrapping.py), by an author who read none of the scenarios, the model, the checks or the shipped
corpus; 2026-12-05.

Each module is a pytest plugin: a provider or proxy wrapper (``pytest_san_make_provider`` /
``pytest_san_make_proxy``) or a switch (``pytest_san_make_switch``, over ``pytest_san.examples.simple_switch``).
A bug declares ``BREAKS``, every rule it breaks; a legal variant declares none and says why the contract allows
it. ``_common`` holds what several entries share (``san-hil mutants --plugin`` skips ``_*.py``). Measure them
with::

    san-hil mutants --plugin tests/support/held_out_fourth --model
"""
