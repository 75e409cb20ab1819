"""Planted provider bugs and legal variants of issue 27, written apart from the shipped corpus (``pytest_san.mutants``):
the project's own regression that the scenarios catch what an outside author's bugs did (each module's ``BREAKS``
names the rules it breaks; a legal variant's is empty). ``tests/pytest_san/scenarios/test_held_out_bugs.py`` runs the
suite with each."""
