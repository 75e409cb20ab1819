"""The README's downstream test, read from README.md wherever a test runs it: its one copy is the README's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_san import Backend, Switch

README = Path(__file__).resolve().parents[2] / "README.md"


def example() -> str:
    """The Python block under the README's "A downstream test": a test module whose one test is ``test_example``
    (the fixtures ``san_switch``, ``san_provider``, ``san_proxy`` and ``san_backend``)."""
    section = README.read_text(encoding="utf-8").split("\n## A downstream test\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


def run_example(switch: Switch, backend: Backend) -> None:
    """The README's ``test_example`` called directly, its fixtures ``switch``, the first node's provider and proxy,
    and ``backend``."""
    namespace: dict[str, Any] = {}
    exec(compile(example(), str(README), "exec"), namespace)
    node = backend.nodes[0]
    namespace["test_example"](switch, node.provider, node.proxy, backend)
