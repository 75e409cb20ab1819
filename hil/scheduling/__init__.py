"""Choosing lab hosts with labgrid (``--san-labgrid FILTER``, extra ``pytest-san[labgrid]``): optional.

labgrid's coordinator queues, prioritises and shows who holds which place; pytest-san reserves a place per
run and per xdist worker, acquires it, and turns its ``NetworkService`` resources into the run's hosts. The
agents' kernel leases (``hil/agent/lease.py``) stay the interlock on every host: labgrid's lock is a name
over an unauthenticated port, so a host it gives out twice is refused by the kernel, naming the real holder.

- ``config``: the validated settings (filter, coordinator, priority) and the session's identity;
- ``coordinator``: the one module that imports labgrid (a typed, synchronous session);
- ``places``: a place's resources as inventory hosts;
- ``booking``: one process's reservation, waited for, acquired, and ended (cancel, then release);
- ``reaper``: stale places of pytest-san identities whose hosts hold no agent lease.
"""

from __future__ import annotations
