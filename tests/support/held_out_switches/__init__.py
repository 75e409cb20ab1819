"""Switch bugs and legal switches written from the docs alone (issue 30, "how it will be checked"), each a plugin
implementing ``pytest_san_make_switch`` over the example switch (``pytest_san.examples.simple_switch``), as an
outside switch author would write one. A module's ``BREAKS`` names the rules its bug breaks; a module without it is
a switch the contract allows. ``tests/pytest_san/scenarios/test_held_out_switch_bugs.py`` runs the suite with each."""
