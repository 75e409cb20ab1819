"""The controller <-> agent protocol: one JSON object per line, versioned.

Shared by both sides, so it uses only the standard library and stays Python 3.9 compatible.

request:  {"id": 7, "obj": 3, "method": "register_memory", "args": [...]}
reply:    {"id": 7, "result": ...}  or  {"id": 7, "error": {"kind", "message", "code", "required_size"}}
values:   bytes -> {"$b": base64}; a remote object -> {"$o": id, "type": name}; a buffer -> {"$buf": [process id,
          address, length]}; lists and dicts as JSON.
          Arguments JSON would change reach the engine as stand-ins it refuses as it refuses them in-process
          (hil/controller/remote.py Session.encode, hil/agent/dispatch.py): another host's buffer -> {"$fbuf": [host,
          address, length]}; an int subclass -> {"$i": [value, repr]}; any other object -> {"$x": repr};
          a DeviceDescription -> {"$dd": {field: value}}.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from typing import Any

PROTOCOL_VERSION = 1


def tree_hash(files: Iterable[tuple[str, bytes]]) -> str:
    """The content hash of a set of files: the agent refuses to answer under any other hash."""
    digest = hashlib.sha256()
    for path, data in sorted(files):
        digest.update(path.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:16]


def _to_json(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        if "$b" in value:
            return base64.b64decode(value["$b"])
        return {k: _from_json(v) for k, v in value.items()}
    return value


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(_to_json(message), separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = _from_json(json.loads(line))
    if not isinstance(message, dict):
        raise ValueError(f"not a protocol message: {line[:80]!r}")
    return message
