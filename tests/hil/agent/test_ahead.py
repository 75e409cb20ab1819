"""Requests that arrive together reach the verbs child together: read-only ones are written ahead and answered
back to back, and nothing asked ahead is used across a request that may change something.

A stand-in child (a small script speaking the child's protocol) answers each request with how many requests it
had answered before, so the tests see when each was made; no RDMA device is needed.
"""

from __future__ import annotations

import io
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.agent import server
from hil.agent.dispatch import Dispatcher, EngineCodec, Registry
from hil.agent.engines.verbs import children
from hil.rpc import framing as wire

COUNTING_CHILD = textwrap.dedent("""
    import json, sys
    print(json.dumps({"id": 0, "result": {"pid": 1}}), flush=True)
    answered = 0
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps({"id": request["id"], "result": [request["method"], answered]}), flush=True)
        answered += 1
""")


@pytest.fixture
def child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[children.ChildProcess]:
    script = tmp_path / "child.py"
    script.write_text(COUNTING_CHILD)
    monkeypatch.setattr(children, "CHILD", str(script))
    proc = children.ChildProcess("dev0", python=sys.executable)
    yield proc
    proc.close()


def test_a_request_asked_ahead_is_answered_when_it_was_written(child: children.ChildProcess) -> None:
    child.prefetch("read", {"address": 8, "length": 4})
    child.prefetch("socket_state", {"socket": 3})
    assert child.call("socket_state", socket=3) == ["socket_state", 1]  # its reply, read past the other's
    assert child.call("read", length=4, address=8) == ["read", 0]  # the same parameters in another order
    assert child.call("read", address=8, length=4) == ["read", 2]  # taken once: asked again now
    child.prefetch("read", {"address": 8, "length": 4})
    child.forget_prefetched()  # a request that changes something comes next: nothing asked ahead is used
    assert child.call("write", address=8, data=b"x") == ["write", 4]
    assert child.call("read", address=8, length=4) == ["read", 5]


class _Ahead:
    def __init__(self) -> None:
        self.log: list[str] = []

    def ask(self, kind: str, method: str, target: Any, args: list[Any]) -> bool:
        if method.startswith("look"):
            self.log.append(f"ahead {method}")
            return True
        return False

    def forget(self) -> None:
        self.log.append("forget")


class _Target:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.log.append(f"made {name}")


def test_runs_of_read_only_requests_are_asked_ahead_and_forgotten_before_a_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ahead = _Ahead()
    registry = Registry(lambda obj: "engine")
    target = _Target(ahead.log)
    registry.pin(target)
    dispatcher = Dispatcher(EngineCodec(registry, lambda *a: None), {}, ahead)
    methods = ["look_a", "look_b", "change", "look_c", "change"]
    monkeypatch.setattr("hil.agent.dispatch.OBJECTS", {"engine": frozenset(methods)})
    lines = [wire.encode({"id": i, "obj": 1, "method": m, "args": []}) for i, m in enumerate(methods)]
    replies = [wire.decode(r) for r in dispatcher.handle_lines(lines)]
    assert [r["id"] for r in replies] == list(range(5)) and all("result" in r for r in replies)
    assert ahead.log == ["ahead look_a", "ahead look_b", "made look_a", "made look_b", "forget", "made change",
                         "ahead look_c", "made look_c", "forget", "made change", "forget"]


def test_lines_that_arrive_together_are_read_together() -> None:
    class Chunks(io.RawIOBase):
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        def read1(self, n: int = -1) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

    stream: Any = Chunks([b'{"a": 1}\n{"b"', b': 2}\n\n{"c": 3}\n', b'{"d": 4}'])
    got = [[json.loads(line) for line in lines] for lines in server._arrivals(stream)]
    assert got == [[{"a": 1}], [{"b": 2}, {"c": 3}], [{"d": 4}]]
