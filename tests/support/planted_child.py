"""A verbs child (hil/agent/engines/verbs/child.py) with one engine bug planted, for the kernel witness's tests.

    python planted_child.py BUG child.py --device rxe0 ...

runs the real child with ``BUG`` planted in its ``VerbsProcess`` first. The bugs exist only here, never in
the engine:

* ``mr-not-deregistered``: deregister_memory forgets a registration without deregistering its MR (the MR
  and its PD are kept alive where the engine no longer looks);
* ``qp-not-destroyed``: close_socket forgets the socket's QP (and so its PD) without destroying it;
* ``under-reported``: registrations() leaves out a socket's last registration.

Standard library and pyverbs; Python 3.9+, as the child.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

KEPT: list[Any] = []  # verbs objects the planted bugs forgot: referenced, so pyverbs never closes them


def _plant(bug: str) -> None:
    from hil.agent.engines.verbs.registrations import Registrations
    from hil.agent.engines.verbs.sockets import Sockets

    if bug == "mr-not-deregistered":
        def deregister_memory(self: Any, socket: int, handle: int) -> None:
            sock = self._sockets.get(socket)
            reg = sock.handles.pop(handle)
            del sock.by_range[(reg.kind, reg.address, reg.length, reg.access)]
            KEPT.extend([reg.mr, sock.pd])  # the PD too: closing it would deregister its MRs
            sock.pd = None

        Registrations.deregister_memory = deregister_memory
    elif bug == "qp-not-destroyed":
        destroy = Sockets.destroy

        def forget_the_qp(self: Any, sock: Any) -> None:
            KEPT.extend([sock.qp, sock.pd])  # the PD too: closing it would destroy its QPs
            sock.qp = sock.pd = None
            destroy(self, sock)

        Sockets.destroy = forget_the_qp
    elif bug == "under-reported":
        reported = Registrations.registrations

        def registrations(self: Any, socket: int) -> list[dict[str, Any]]:
            return list(reported(self, socket))[:-1]

        Registrations.registrations = registrations
    else:
        raise SystemExit(f"planted_child.py: no bug named {bug!r}")


def main() -> None:
    bug, child, *args = sys.argv[1:]
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(child), *[os.pardir] * 4)))
    _plant(bug)
    sys.argv = [child, *args]
    runpy.run_path(child, run_name="__main__")


if __name__ == "__main__":
    main()
