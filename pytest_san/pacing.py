"""Waiting without spinning, for loops that poll a backend until something happens."""

from __future__ import annotations

import time


class Backoff:
    """A pause after each round in which nothing moved, doubling from ``first`` up to ``most`` seconds, and
    none after a round that moved something. On the emulator a round that moves nothing is the end of what
    can happen; on a lab each round is a round trip the hosts must answer, and a loop that asked again at
    once would spend the guests' CPU on questions instead of on the transfers it waits for."""

    def __init__(self, first: float = 0.0002, most: float = 0.01) -> None:
        self.first, self.most, self.pause = first, most, first

    def after(self, moved: bool) -> None:
        if moved:
            self.pause = self.first
            return
        time.sleep(self.pause)
        self.pause = min(self.most, self.pause * 2)
