"""Lines on the wire: one JSON object per line, versioned; and the content hash of an agent's files.

Both hops frame their messages so (values: ``codec.py``; errors: ``errors.py``; methods: ``methods.py``):

controller -> agent   {"id": 7, "obj": 3, "method": "register_memory", "args": [...]}
agent -> controller   {"hello": {...}} once, then {"id": 7, "result": ...} or {"id": 7, "error": {...}}
agent -> verbs child  {"id": 7, "method": "alloc", "params": {...}}
verbs child -> agent  {"id": 0, "result": hello} once, then {"id": 7, "result": ...} or {"id": 7, "error": {...}}

Standard library + ``pytest_san.spi.contract``, Python 3.9 compatible (pushed to hosts).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from hil.rpc.codec import from_json, to_json

PROTOCOL_VERSION = 1


def tree_hash(files: Iterable[tuple[str, bytes]]) -> str:
    """The content hash of a set of files: the agent refuses to answer under any other hash."""
    digest = hashlib.sha256()
    for path, data in sorted(files):
        digest.update(path.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:16]


def encode(message: Mapping[str, object]) -> bytes:
    """One line: ``message`` as JSON, its bytes as ``{"$b": base64}``."""
    return json.dumps(to_json(message), separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The message of one line (its values are whatever was sent), its bytes bytes again."""
    message = from_json(json.loads(line))
    if not isinstance(message, dict):
        raise ValueError(f"not a protocol message: {line[:80]!r}")
    return message
