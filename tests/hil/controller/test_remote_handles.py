"""A register_memory handle is opaque (CONTRACT.md section 2): the controller's stand-ins hand back what the agent's
provider chose, as JSON carried it, and send it back unchanged; they never make it an int."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hil.controller.remote import RemoteProvider, Session, StandInCodec, as_handle
from hil.rpc.codec import from_json, to_json


class Recording:
    """A session stand-in: answers register_memory with ``handle`` and keeps what deregister_memory was sent."""

    def __init__(self, handle: object) -> None:
        self.handle = handle
        self.sent: list[tuple[str, tuple[object, ...]]] = []
        self.deferred = None  # no end of a test collects its calls

    def call(self, oid: int, method: str, *args: object, timeout: float | None = None) -> Any:
        self.sent.append((method, args))
        # What the agent's answer is once it crossed the wire: JSON, decoded.
        return from_json(json.loads(json.dumps(to_json(self.handle)))) if method == "register_memory" else None


@pytest.mark.parametrize("handle", [7, "lkey-0x1c", 0, "12"], ids=["int", "string", "zero", "digits"])
def test_a_handle_round_trips_unchanged(handle: object) -> None:
    session = Recording(handle)
    provider = RemoteProvider(session, 3)  # type: ignore[arg-type]
    got = provider.register_memory(object(), object(), 1)  # type: ignore[arg-type]
    assert got == handle and type(got) is type(handle)
    provider.deregister_memory(object(), got)  # type: ignore[arg-type]
    assert session.sent[-1][0] == "deregister_memory" and session.sent[-1][1][1] == handle


def test_what_the_codec_sends_of_a_handle_is_the_handle() -> None:
    codec = StandInCodec(Session.__new__(Session))
    for handle in (7, "lkey-0x1c"):
        assert from_json(json.loads(json.dumps(to_json(codec.encode(handle))))) == handle


def test_an_array_handle_stays_hashable() -> None:
    assert as_handle([1, "a"]) == (1, "a") and hash(as_handle([1, "a"])) == hash((1, "a"))
    assert as_handle("7") == "7" and as_handle(7) == 7
