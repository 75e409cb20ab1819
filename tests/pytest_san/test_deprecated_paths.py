"""``pytest_san.types`` and ``pytest_san.errors``, the old import paths of the contract's names, still hand them
out, each with a DeprecationWarning naming where to import it from; the package itself imports neither."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import pytest_san
from pytest_san.spi import contract

OLD = {"pytest_san.types": ["Access", "Completion", "DeviceDescription", "Leak", "PAGE_SIZE", "Status", "is_int"],
       "pytest_san.errors": ["SanError", "WsaError"]}


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in OLD.items() for n in names])
def test_an_old_path_gives_the_same_object_with_a_deprecation_warning(module: str, name: str) -> None:
    old = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{name} is deprecated: import {name} from ") as seen:
        value = getattr(old, name)
    assert value is getattr(contract, name)
    where = "pytest_san" if name in pytest_san.__all__ else "pytest_san.spi.contract"
    assert str(seen[0].message).endswith(f"from {where}")
    assert seen[0].filename == __file__  # the line that asked, not the alias module


def test_a_name_the_old_paths_never_held_is_an_attribute_error() -> None:
    import pytest_san.types as old

    with pytest.raises(AttributeError, match=r"'pytest_san\.types' has no attribute 'Switch'"):
        old.Switch  # noqa: B018


def test_the_package_imports_the_contract_by_one_path() -> None:
    root = Path(pytest_san.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] in ("types", "errors") \
                    and (node.level or (node.module or "").startswith("pytest_san")):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, f"import the contract's names from pytest_san.spi.contract, not {offenders}"
