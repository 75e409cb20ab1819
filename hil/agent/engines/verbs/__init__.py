"""The verbs engine: a real SAN provider on pyverbs, run by the agent on a lab host.

Standard library + pyverbs only, Python 3.9 compatible, and no import of pytest_san: the agent
copies only itself to the host. ``process`` runs inside one child OS process per modelled process
(its own Context/PD/CQ); ``child`` is that child's main loop; ``host`` runs in the agent's main
process (device selection, spawning children, the pinned-memory proxy).
"""

from __future__ import annotations
