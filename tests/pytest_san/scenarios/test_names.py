"""The conformance scenarios judge providers other people write, so they reach them only through the public
protocols: every attribute a scenario reads or calls is a name of the protocols (or of the scenarios' own
helpers, or of a module or class they import), none assigns an attribute of a provider, proxy or backend
object, and none imports the emulator, hil or other internals. A wrapper that forwards the protocols' calls
then sees everything a scenario does to the provider it wraps (issue 19: NOLOWMEM was once set by assigning
``proxy.nolowmem``, which a wrapper kept for itself)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import random
from pathlib import Path

import pytest

import pytest_san
import pytest_san.scenarios
from pytest_san import batch, switch
from pytest_san.plugin import hookspecs
from pytest_san.spi import burst, checks, contract, protocols

SCENARIOS = Path(pytest_san.scenarios.__file__).parent
FILES = sorted(SCENARIOS.glob("*.py"))

PUBLIC_MODULES = {"pytest_san", "pytest_san.batch", "pytest_san.spi.burst", "pytest_san.spi.protocols",
                  "pytest_san.spi.contract", "pytest_san.spi.checks"}
"""What a scenario may import of pytest-san (besides its own package). ``batch`` makes the calls it is given on
the protocols' own methods, together through the backend's ``Batching`` where it has one: a wrapper of a
provider still sees each call. ``contract`` holds the contract's constants and value types (CONTRACT.md section 2)
and ``checks`` its table of every check a call makes (section 4), from which ``faults.py`` generates the bad
arguments: both are the contract's own text, binding no implementation."""

CONNECTION = {"local", "remote", "trace", "close", "flush", "progress", "run_until"}
ENDPOINT = {"socket", "process", "provider", "proxy", "peer", "name", "send", "recv", "close", "progress"}
"""The switch's connection and endpoints as CONTRACT.md section 5 names them."""


def _public(obj: object) -> set[str]:
    names = {n for n in dir(obj) if not n.startswith("_")}
    for klass in getattr(obj, "__mro__", ()):
        names |= {n for n in getattr(klass, "__annotations__", {}) if not n.startswith("_")}
    return names


def allowed_names() -> set[str]:
    """Every name of the public protocols and value types, and of the switch's documented surface."""
    names = set(CONNECTION | ENDPOINT)
    for module in (protocols, contract):
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__.startswith("pytest_san"):
                names |= _public(obj)
    names |= _public(switch.Switch) | _public(pytest_san.SanError) | {"code", "message", "required_size"}
    names |= set(burst.__all__) | set(batch.__all__) | _public(batch.Later) | _public(batch.Batch)
    names |= {n for n in dir(checks) if not n.startswith("_")} | _public(checks.Check)
    # the plugin's hooks as pytest calls them (request.config.hook.NAME): a switch a scenario makes over a backend
    # it wrapped itself comes from pytest_san_make_switch like the fixture's
    names |= {n for n in dir(hookspecs) if n.startswith("pytest_san_")} | {"config", "hook"}
    return names


def _own_names(trees: list[ast.Module]) -> set[str]:
    """Names the scenarios package defines itself: its functions, classes, their attributes and fields."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                own.add(node.attr)
    return own


def _imported(tree: ast.Module) -> set[str]:
    """Local names bound by imports of modules and of classes (their attributes are theirs, not a provider's)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {(a.asname or a.name).partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            bound |= {a.asname or a.name for a in node.names}
    return bound


BUILTIN = set().union(*(_public(t) for t in (list, dict, set, str, bytes, pytest.ExceptionInfo, random.Random)))
BUILTIN |= {"__name__"}
"""Methods of the values a scenario builds itself (lists, strings, bytes, a seeded ``random.Random``) and of
``pytest.raises``'s result."""
VALUES = {f.name for f in dataclasses.fields(contract.DeviceDescription)}
"""Fields a scenario may set: of the value types it builds and passes in (a DEVICE_DESCRIPTION)."""


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


TREES = [ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for path in FILES]
ALLOWED = allowed_names() | _own_names(TREES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_scenarios_import_only_the_public_api(path: Path) -> None:
    tree = TREES[FILES.index(path)]
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith(("pytest_san", "hil")) and node.module not in PUBLIC_MODULES \
                    and any(f"{node.module}.{a.name}" not in PUBLIC_MODULES for a in node.names):
                bad.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            bad += [f"line {node.lineno}: import {a.name}" for a in node.names
                    if a.name.startswith(("pytest_san", "hil")) and a.name not in PUBLIC_MODULES]
    assert not bad, f"{path.name} reaches past the public API: {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_scenarios_use_only_the_protocols_names(path: Path) -> None:
    tree = TREES[FILES.index(path)]
    modules = _imported(tree)
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        root = _root(node)
        if isinstance(root, ast.Name) and root.id in modules:
            continue  # pytest.mark.parametrize, itertools.pairwise, Access.READ, ...
        if isinstance(node.ctx, ast.Store):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self") and node.attr not in VALUES:
                bad.append(f"line {node.lineno}: assigns .{node.attr}")
        elif node.attr not in ALLOWED | BUILTIN:
            bad.append(f"line {node.lineno}: .{node.attr}")
    assert not bad, f"{path.name} uses names no public protocol has: {bad}"


def test_the_check_sees_a_reach_into_internals() -> None:
    tree = ast.parse("def test_x(san_proxy):\n    san_proxy.nolowmem = True\n    san_proxy._memory.free_bytes\n")
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)]
    unknown = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr not in ALLOWED]
    assert [n.attr for n in stores] == ["nolowmem"]
    assert unknown == ["free_bytes", "_memory"]
