"""Which pip extra provides the third-party modules hil imports: one line instead of a traceback.

Standard library only, so that it can be imported (and say what is missing) when they are not.
"""

from __future__ import annotations

__all__ = ["missing_extra"]

_EXTRA_OF = {"paramiko": "hil", "yaml": "hil", "matplotlib": "nightly", "pyroute2": "lab", "labgrid": "labgrid",
             "grpc": "labgrid"}


def missing_extra(exc: BaseException) -> str | None:
    """For an ImportError of a module an extra of pytest-san provides, the line that says which to install."""
    if not isinstance(exc, ImportError):
        return None
    top = (exc.name or "").partition(".")[0]
    extra = _EXTRA_OF.get(top)
    if extra is None:
        return None
    return f"the Python module {top!r} is missing: install the {extra} extra: pip install 'pytest-san[{extra}]'"
