"""The old import paths ``pytest_san.types`` and ``pytest_san.errors``: each name they held, forwarded to
``pytest_san.spi.contract`` with a DeprecationWarning that names the importing line (PEP 562)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from .spi import contract


def forward(module: str, names: Sequence[str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that hands out ``contract``'s ``names``; other names are AttributeErrors."""

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        from . import __all__ as public  # the package's public face, imported by the time a name is asked for

        where = "pytest_san" if name in public else "pytest_san.spi.contract"
        warnings.warn(f"{module}.{name} is deprecated: import {name} from {where}", DeprecationWarning,
                      stacklevel=2)
        return getattr(contract, name)

    return __getattr__
