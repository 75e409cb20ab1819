"""The verbs engine: a real SAN provider on pyverbs, run by the agent on a lab host.

Standard library + pyverbs + ``pytest_san.spi.contract`` (the contract's values, pushed with the agent),
Python 3.9 compatible. In the agent's main process: ``engine`` (what the agent dispatches to),
``devices`` (device, port and GID selection), ``children`` (one child OS process per modelled
process, and its client), ``proxy`` and ``physical`` (the pinned-memory proxy driver; ``host``
re-exports these four). In each child: ``child`` (its request loop) and ``process`` (``VerbsProcess``,
composed of ``context``, ``memory``, ``completions``, ``sockets`` with ``connections``, ``registrations``,
``posting`` with ``bursts``, and ``releases``, which pass each other the records of ``records``);
``enums`` and ``libc`` wrap pyverbs' constants and the C library.
"""

from __future__ import annotations
