"""Examples that ship with pytest-san.

``pytest_san.examples.broken_provider`` is a deliberately broken provider: load it with
``pytest --pyargs pytest_san.scenarios -p pytest_san.examples.broken_provider`` and exactly R6 and R7 fail.
"""
