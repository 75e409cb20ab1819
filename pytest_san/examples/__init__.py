"""Examples that ship with pytest-san.

``pytest_san.examples.broken_provider`` is a deliberately broken provider: load it with
``pytest --pyargs pytest_san.scenarios -p pytest_san.examples.broken_provider`` and exactly R6 and R7 fail.

``pytest_san.examples.simple_switch`` is a second Windows Sockets switch, written over the ``Provider`` protocol
alone: ``pytest --pyargs pytest_san.scenarios -p pytest_san.examples.simple_switch`` puts it under test in place
of pytest-san's own (``pytest_san_make_switch``), and the suite passes.
"""
