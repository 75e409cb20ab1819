"""The agent answers every request line, however malformed, and keeps serving (engine emulator).

The agent is started as the controller starts it (pushed, then ``__main__.py`` through the local
transport), and spoken to with raw lines: nothing of the controller's client checks them first.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.controller.client import AgentError, _error, push_agent
from hil.inventory import HostConfig
from hil.transport import Channel, LocalTransport


class RawAgent:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.hello: dict[str, Any] = json.loads(channel.readline(60))["hello"]

    def send(self, line: bytes) -> dict[str, Any]:
        self.channel.write(line)
        reply: dict[str, Any] = json.loads(self.channel.readline(30))
        return reply

    def call(self, rid: int, obj: int, method: str, *args: Any) -> Any:
        reply = self.send(json.dumps({"id": rid, "obj": obj, "method": method, "args": list(args)}).encode() + b"\n")
        assert reply.get("id") == rid and "result" in reply, reply
        return reply["result"]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RawAgent]:
    host = HostConfig(name="raw", host="localhost", connection="local", extra={"san_remote_tmp": str(tmp_path)})
    with LocalTransport(host) as transport:
        directory, content_hash = push_agent(transport)
        channel = transport.spawn([sys.executable, f"{directory}/hil/agent/__main__.py", "--engine", "emulator",
                                   "--host", "raw", "--hash", content_hash])
        yield RawAgent(channel)


BAD_LINES = [
    b'{"id": 1, "obj": 1, "meth\n',  # truncated
    b"[1, 2, 3]\n",
    b"42\n",
    b'"a string"\n',
    b"null\n",
    b"\xff\xfe garbage\n",
    b"[" * 100_000 + b"\n",  # nested too deep for the JSON decoder
    b'{"id": 2, "obj": 1, "method": "leaks", "args": [{"$b": "not base64!"}]}\n',
]


@pytest.mark.parametrize("line", BAD_LINES, ids=range(len(BAD_LINES)))
def test_an_unreadable_line_gets_an_error_reply(agent: RawAgent, line: bytes) -> None:
    reply = agent.send(line)
    assert reply["error"]["kind"] == "ProtocolError" and "not a request" in reply["error"]["message"]
    assert reply["id"] == (2 if b'"id": 2' in line else None)  # the id, where it could be read
    assert agent.channel.alive


def test_malformed_requests_get_error_replies_and_nothing_is_lost(agent: RawAgent) -> None:
    engine = agent.hello["engine_ref"]["$o"]
    node = agent.hello["nodes"][0]
    provider = node["provider"]["$o"]
    process = agent.call(1, node["node"]["$o"], "default_process")["$o"]
    peer = agent.call(2, agent.hello["nodes"][1]["node"]["$o"], "default_process")["$o"]
    sock, _ = agent.call(3, engine, "connect_local", {"$o": process}, {"$o": peer})
    buf = agent.call(4, process, "alloc", 4096)
    agent.call(5, provider, "register_memory", sock, buf, 3)
    before = agent.call(6, provider, "registrations", sock)
    assert len(before) == 1

    requests: list[tuple[Any, str]] = [
        ({"id": 10}, "ProtocolError"),  # no obj, no method
        ({"id": 11, "obj": engine}, "ProtocolError"),  # no method
        ({"id": 12, "obj": engine, "method": 7, "args": []}, "ProtocolError"),
        ({"id": 13, "obj": engine, "method": "leaks", "args": {"a": 1}}, "ProtocolError"),
        ({"id": 14, "obj": 99999, "method": "leaks", "args": []}, "LookupError"),  # unknown object
        ({"id": 15, "obj": True, "method": "leaks", "args": []}, "ProtocolError"),  # not object 1
        ({"id": 16, "obj": [engine], "method": "leaks", "args": []}, "ProtocolError"),
        ({"id": 17, "obj": "1", "method": "leaks", "args": []}, "ProtocolError"),
        ({"id": 18, "obj": engine, "method": "__init__", "args": []}, "LookupError"),
        ({"id": 19, "obj": process, "method": "alloc", "args": ["4096"]}, "TypeError"),
        ({"id": 20, "obj": process, "method": "alloc", "args": [1, 2, 3]}, "TypeError"),
        ({"id": 21, "obj": provider, "method": "register_memory", "args": [{"$o": [1]}, buf, 3]}, "ProtocolError"),
        ({"id": 22, "obj": provider, "method": "register_memory", "args": [sock, {"$buf": 5}, 3]}, "ProtocolError"),
        ({"id": 23, "obj": provider, "method": "register_memory", "args": [sock, {"$buf": [1, 2]}, 3]},
         "ProtocolError"),
        ({"id": 24, "obj": provider, "method": "deregister_memory", "args": [sock]}, "TypeError"),
        ({"id": 25, "obj": process, "method": "alloc", "args": [{"$i": "7"}]}, "ProtocolError"),
        ({"id": 26, "obj": process, "method": "alloc", "args": [{"$i": [7, "Seven", 1]}]}, "ProtocolError"),
        ({"id": 27, "obj": provider, "method": "register_memory", "args": [sock, {"$fbuf": ["h", 1]}, 3]},
         "ProtocolError"),
        ({"id": "text-id", "obj": engine, "method": "nothing", "args": []}, "LookupError"),
    ]
    for request, kind in requests:
        reply = agent.send(json.dumps(request).encode() + b"\n")
        assert reply["id"] == request["id"] and reply["error"]["kind"] == kind, (request, reply)
        assert "traceback" not in reply["error"], reply
    for line in BAD_LINES:
        assert "error" in agent.send(line)
    assert agent.call(30, provider, "registrations", sock) == before  # the agent kept serving, holding it
    assert agent.call(31, engine, "leaks") != []  # the registration is still there
    agent.channel.close()
    assert agent.channel._exit_status(wait=5) == 0  # on EOF it released everything and exited cleanly


def test_an_engine_failure_is_an_agent_error_and_the_builtin_it_was() -> None:
    err = _error({"kind": "AttributeError", "message": "'NoneType' object has no attribute 'x'",
                  "traceback": "Traceback ..."}, "host lab1")
    assert isinstance(err, AgentError) and isinstance(err, AttributeError)  # caught as in-process
    assert str(err) == "host lab1: AttributeError: 'NoneType' object has no attribute 'x'\nTraceback ..."
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and str(again) == str(err)
    assert type(_error({"kind": "SystemError", "message": "?"}, "host lab1")) is AgentError
    assert type(_error({"kind": "TypeError", "message": "buffers[0] is not a pair"}, "h")) is TypeError
    unknown = _error({"kind": "SanError", "code": 1, "message": "?"}, "host lab1")
    assert type(unknown) is AgentError and "unknown code 1" in str(unknown)
