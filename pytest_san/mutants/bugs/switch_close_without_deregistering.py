"""The switch closes a socket without deregistering its regions first, leaving them to the provider.

Breaks R11 (before closing a socket the switch deregisters every region no pending operation uses). Nothing
leaks (the provider releases what a closed socket held), which is why it goes unnoticed. Realistic: a close path
that relies on WSPCloseSocket cleaning up. Over pytest-san's own switch: the socket is closed before the
switch's own close runs, which then finds it gone.
"""

from __future__ import annotations

from ..switching import ConnectionView, EndpointView, SwitchWrapper, own_switch, switch_hook, traced

BREAKS = ("R11",)


class ClosesFirst(EndpointView):
    def close(self) -> None:
        if not self.inner.socket.closed and self.inner.process.alive:
            traced(self.inner, self.conn, "close_socket")
            self.inner.provider.close_socket(self.inner.socket)  # the bug: nothing deregistered before
        self.inner.close()


class Connection(ConnectionView):
    endpoint = ClosesFirst


class CloseWithoutDeregistering(SwitchWrapper):
    view = Connection


pytest_san_make_switch = switch_hook(lambda backend: CloseWithoutDeregistering(own_switch(backend)))
