"""The values that cross a process boundary, both hops (controller <-> agent, agent <-> verbs child).

Every line (``framing.py``) is one JSON object whose bytes travel as ``{"$b": base64}``, wherever they
are in it: :func:`to_json` and :func:`from_json`, applied to whole messages. What else JSON would change
or cannot carry travels tagged, encoded and decoded by :class:`Codec`:

  ``{"$o": id}``                        an object the agent holds (its answers add ``"type": kind``)
  ``{"$buf": [process id, address, length]}``  a buffer of one of the agent's processes
  ``{"$fbuf": [host, address, length]}``     another host's buffer: of a process the agent does not know
  ``{"$i": [value, repr]}``             an int subclass (an enum of another type): an int, but no ``int``
  ``{"$x": repr}``                      any other object: for the receiver, an object it knows nothing of
  ``{"$dd": {field: value}}``           a DeviceDescription, field by field
  ``{"$r": request id}``                what an earlier request of the same pipelined stream returned (an
                                        agent's request only: calls made together name earlier results so)

The contract's own enums (``Access``, ``CacheType``) travel as their int values. Arguments JSON would
change reach the engine as stand-ins it refuses as it refuses them in-process (CONTRACT.md section 4). What is
side-specific comes from small subclasses: which of a side's objects become references (:meth:`Codec.own`),
what an object it cannot send becomes (:meth:`Codec.opaque`), how a reference resolves
(:meth:`Codec.resolve`, :meth:`Codec.owner`, :meth:`Codec.buffer`), and the DeviceDescription class
(``description``: the sides decode ``pytest_san.spi.contract.DeviceDescription``; the verbs child, which imports
this module too, has none to decode). Standard library + ``pytest_san.spi.contract``, Python 3.9 compatible.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hil.rpc.errors import ProtocolError
from pytest_san.spi.contract import Access, CacheType

if TYPE_CHECKING:
    from typing import TypeAlias

    Encoded: TypeAlias = "bool | int | float | str | bytes | list[Encoded] | dict[str, Encoded] | None"
    """An encoded value: JSON, plus bytes (a line's framing carries them as ``{"$b": base64}``)."""


def to_json(value: object) -> object:
    """``value`` with its bytes, wherever they are, as ``{"$b": base64}`` (a whole message, on its way out)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(value: Any) -> Any:
    """A decoded JSON value (arbitrary) with every ``{"$b": base64}`` as bytes again."""
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if isinstance(value, dict):
        if "$b" in value:
            return base64.b64decode(value["$b"])
        return {k: from_json(v) for k, v in value.items()}
    return value


def shown(value: object) -> str:
    """How a value sent as a stand-in shows in the receiver's error messages (its repr, as in-process)."""
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break the call
        text = f"<{type(value).__name__} object (repr failed: {type(exc).__name__})>"
    return text[:200]


def object_ref(oid: int, kind: str | None = None) -> dict[str, Encoded]:
    """``{"$o": oid}``; the agent's answers name the object's kind too (``"type"``)."""
    return {"$o": oid} if kind is None else {"$o": oid, "type": kind}


def buffer_ref(owner: Encoded, address: Encoded, length: Encoded, *, foreign: bool = False) -> dict[str, Encoded]:
    """``{"$buf": [process id, address, length]}``, or ``{"$fbuf": [host, ...]}`` for another host's buffer."""
    return {"$fbuf" if foreign else "$buf": [owner, address, length]}


def referenced(ref: Mapping[str, Any]) -> Any:
    """The id in a reference the agent answered (``object_ref``): as sent."""
    return ref["$o"]


def buffer_fields(ref: Mapping[str, Any]) -> Any:
    """[process id, address, length] of a buffer reference the agent answered (``buffer_ref``): as sent."""
    return ref["$buf"]


def object_id(value: object) -> int:
    """The id of a ``{"$o": id}`` reference (or of a request's target): an int, and not ``True``."""
    if type(value) is not int:  # not True, which would be object 1
        raise ProtocolError(f"an object id is an int, got {value!r:.80}")
    return value


class Opaque:
    """``{"$x": repr}``: an argument the sender could not send as itself (an object of its own process,
    another host's object). To the receiver, an object it knows nothing of, as it would be in-process."""

    def __init__(self, shown: str) -> None:
        self._shown = shown

    def __repr__(self) -> str:
        return self._shown


class ForeignInt(int):
    """``{"$i": [value, repr]}``: an int subclass sent as an argument: still an int, not an ``int``."""

    _shown = ""

    @classmethod
    def make(cls, value: int, shown: str) -> ForeignInt:
        number = cls(value)
        number._shown = shown
        return number

    def __repr__(self) -> str:
        return self._shown or int.__repr__(self)


class Codec:
    """Values to their encoded form and back; subclasses add what is their side's own."""

    description: type | None = None
    """The DeviceDescription class, where this side knows it: its instances travel as ``{"$dd": ...}``."""

    # -- encoding ----------------------------------------------------------------------------------

    def encode(self, value: object) -> Encoded:
        """``value`` as the other side should see it: itself where JSON carries it faithfully, else a stand-in.

        Whatever JSON would change (a tuple's subclass, a memoryview, an int subclass, a dict with '$'
        keys, an object of this process) becomes something that is equally not what the receiver expects.
        """
        if value is None or isinstance(value, (bool, str, float)):
            return value  # JSON's own (bool before int: True is no 1)
        if type(value) is int or type(value) is bytes:
            return value
        own = self.own(value)
        if own is not None:
            return own
        if isinstance(value, (Access, CacheType)):
            return int(value)  # what the engines take for these enums: their int value
        if isinstance(value, int):
            return {"$i": [int(value), shown(value)]}
        if type(value) is bytearray:
            return bytes(value)
        if type(value) is list or type(value) is tuple:
            return [self.encode(v) for v in value]
        if self.description is not None and type(value) is self.description and dataclasses.is_dataclass(value):
            return {"$dd": {f.name: self.encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
        if type(value) is dict and all(type(k) is str and not k.startswith("$") for k in value):
            return {k: self.encode(v) for k, v in value.items()}
        return self.opaque(value)

    def own(self, value: object) -> Encoded:
        """What this side sends for one of its own objects (a reference, say); None: not one of them."""
        return None

    def opaque(self, value: object) -> Encoded:
        """What an object that has no encoding becomes."""
        return {"$x": shown(value)}

    # -- decoding ----------------------------------------------------------------------------------

    def decode(self, value: Any) -> Any:
        """A received value (JSON, its bytes already bytes: arbitrary) with every tagged value resolved."""
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "$o" in value:
            return self.resolve(object_id(value["$o"]))
        if "$buf" in value or "$fbuf" in value:
            ref = value.get("$buf", value.get("$fbuf"))
            if not isinstance(ref, list) or len(ref) != 3:
                raise ProtocolError(f"a buffer reference is [process, address, length], got {ref!r:.80}")
            owner, address, length = ref
            process = self.owner(owner, foreign="$fbuf" in value)
            return self.buffer(process, self.decode(address), self.decode(length))
        if "$x" in value:
            return Opaque(str(value["$x"]))
        if "$r" in value:
            return self.earlier(value["$r"])
        if "$i" in value:
            ref = value["$i"]
            if not isinstance(ref, list) or len(ref) != 2 or type(ref[0]) is not int:
                raise ProtocolError(f"an int subclass is [value, repr], got {ref!r:.80}")
            return ForeignInt.make(ref[0], str(ref[1]))
        if "$dd" in value and self.description is not None:
            fields = value["$dd"]
            known = {f.name for f in dataclasses.fields(self.description)}
            if type(fields) is not dict or not set(fields) <= known:
                raise TypeError(f"not the fields of a DeviceDescription: {fields!r:.80}")
            return self.description(**{k: self.decode(v) for k, v in fields.items()})
        return {k: self.decode(v) for k, v in value.items()}

    def resolve(self, oid: int) -> object:
        """The object ``{"$o": oid}`` names."""
        raise ProtocolError(f"no object {oid} is known here")

    def earlier(self, rid: object) -> object:
        """What the earlier request ``{"$r": rid}`` names returned."""
        raise ProtocolError(f"no earlier results are known here (asked for request {rid!r:.40})")

    def owner(self, owner: object, *, foreign: bool) -> object:
        """The process of a ``$buf`` (an object id) or of a ``$fbuf`` (another host's name)."""
        raise ProtocolError(f"no process {owner!r:.80} is known here")

    def buffer(self, process: object, address: object, length: object) -> object:
        """A buffer of ``process``; ``address`` and ``length`` as sent, for the receiver to judge."""
        raise ProtocolError("no buffers are known here")
