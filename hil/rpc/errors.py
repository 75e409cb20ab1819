"""Errors across a process boundary, both hops: an exception to an error object and back.

An error object is ``{"code", "kind", "message", "required_size"}``: a ``SanError`` (the contract's,
``pytest_san.spi.contract``) has its Winsock code, its message (the detail, without the code's name) and
the size a descriptor-too-small probe asks for; anything else has ``code`` and ``required_size`` null,
its class name as ``kind`` and ``str(exc)`` as message. The agent adds ``"traceback"`` for a failure
that is not a refused argument or request.

Back on the caller's side a SanError is a SanError again (code, message, required_size), a
TimeoutError, ValueError or TypeError is itself (the errors of the contract and of a call's
arguments, raised as the emulator raises them in-process), and anything else is what the caller's
``fallback`` makes of it: the controller an ``AgentError`` naming the host, with the agent's
traceback; the agent, for its verbs children, a ``ChildFailure``.
Standard library + ``pytest_san.spi.contract``, Python 3.9 compatible.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pytest_san.spi.contract import SanError, WsaError


class ProtocolError(Exception):
    """A line, request or tagged value that is not well formed: answered with an error, never fatal."""


# Kinds whose traceback is not sent: a bad argument or request, not a failure (exactly these classes:
# a KeyError, say, is an engine's bug and comes with its traceback).
QUIET: tuple[type[Exception], ...] = (ValueError, TimeoutError, LookupError, TypeError, ProtocolError)

# Raised on the caller's side as themselves.
AS_ITSELF: dict[str, type[Exception]] = {"TimeoutError": TimeoutError, "ValueError": ValueError,
                                         "TypeError": TypeError}

if TYPE_CHECKING:
    ErrorObject = dict[str, str | int | None]

    Fallback = Callable[[str, str, str | None], Exception]
    """(kind, message, traceback or None) -> the exception for an error that is not raised as itself."""


def describe(exc: BaseException, *, with_traceback: bool = False) -> ErrorObject:
    """The error object of ``exc``; ``with_traceback``: add where a failure (not a refusal) came from."""
    if isinstance(exc, SanError):
        return {"code": int(exc.code), "kind": "SanError", "message": exc.message,
                "required_size": exc.required_size}
    error: ErrorObject = {"code": None, "kind": type(exc).__name__, "message": str(exc), "required_size": None}
    if with_traceback and type(exc) not in QUIET:
        error["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))
    return error


def rebuild(error: Mapping[str, object], fallback: Fallback) -> Exception:
    """The exception an error object stands for (see the module's docstring)."""
    sent = error.get("kind")
    kind = sent if isinstance(sent, str) and sent else "Error"
    message = str(error.get("message") or "")
    if kind == "SanError":
        code = error.get("code")
        try:
            wsa = WsaError(int(code)) if isinstance(code, (int, float, str)) else None
        except (ValueError, OverflowError):
            wsa = None
        if wsa is None:
            return fallback(kind, f"unknown code {code!r}: {message}", None)
        required = error.get("required_size")
        if not isinstance(required, int) or isinstance(required, bool):
            required = None
        return SanError(wsa, message, required_size=required)
    if kind in AS_ITSELF:
        return AS_ITSELF[kind](message)
    trace = error.get("traceback")
    return fallback(kind, message, trace if isinstance(trace, str) and trace else None)
