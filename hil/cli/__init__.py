"""The ``san-hil`` command: its entry point and parser (:mod:`hil.cli.main`), what it accepts (``arguments``),
how it writes to the terminal (``console``), and one module per command: ``prepare``, ``lab``, ``nightly``,
``matrix``, ``mutants``, ``run`` and ``labgrid``. The work each command does lives in its own room (``hil.lab``,
``hil.nightly``, ``hil.remote_run``, ``hil.scheduling``, ``pytest_san.mutants.runner``); here is what it takes
from the command line and what it prints."""
