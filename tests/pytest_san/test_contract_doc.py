"""pytest_san/CONTRACT.md tells the truth about the suite: every rule of the catalog is there, each lists
scenarios that exist and carry that rule's ``san_rule`` marker, no scenario of a rule is left out, and the
capabilities a listed scenario needs are the ones its ``san_requires`` marker names.

The document is read where the installed package has it (package data), so under tox this checks the
wheel's copy.
"""

from __future__ import annotations

import importlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

import pytest_san
import pytest_san.scenarios
from pytest_san import contract_table
from pytest_san.report import RULE_IDS
from pytest_san.spi import checks

CONTRACT = Path(pytest_san.__file__).with_name("CONTRACT.md")
SCENARIOS = Path(pytest_san.scenarios.__file__).parent

RULE_HEADING = re.compile(r"^### (?P<rule>[RP]\d+): ", re.MULTILINE)
LISTED = re.compile(r"^- `(?P<file>test_\w+\.py)::(?P<test>test_\w+)`(?: \(needs (?P<needs>[^)]*)\))?$",
                    re.MULTILINE)


def _sections() -> dict[str, str]:
    text = CONTRACT.read_text(encoding="utf-8")
    heads = list(RULE_HEADING.finditer(text))
    ends = [h.start() for h in heads[1:]] + [text.find("\n## ", heads[-1].start())]
    return {h["rule"]: text[h.end():end] for h, end in zip(heads, ends, strict=True)}


def _listed(section: str) -> dict[str, set[str] | None]:
    """scenario -> the capabilities its entry says it needs (None: the entry says nothing)."""
    return {f"{m['file']}::{m['test']}": (None if m["needs"] is None else set(re.findall(r"`(\w+)`", m["needs"])))
            for m in LISTED.finditer(section)}


def _scenarios() -> dict[str, tuple[set[str], set[str]]]:
    """Every scenario of the suite: file::name -> (its san_rule ids, its san_requires capabilities)."""
    found: dict[str, tuple[set[str], set[str]]] = {}
    for path in sorted(SCENARIOS.glob("test_*.py")):
        module = importlib.import_module(f"pytest_san.scenarios.{path.stem}")
        for name, obj in vars(module).items():
            if name.startswith("test_") and callable(obj):
                marks = getattr(obj, "pytestmark", [])
                rules = {arg for m in marks if m.name == "san_rule" for arg in m.args}
                needs = {arg for m in marks if m.name == "san_requires" for arg in m.args}
                found[f"{path.name}::{name}"] = (rules, needs)
    return found


def test_the_contract_ships_with_the_package() -> None:
    assert CONTRACT.is_file(), f"{CONTRACT} is missing: it is package data (pyproject.toml)"


def test_every_rule_of_the_catalog_has_a_section_in_catalog_order() -> None:
    assert tuple(_sections()) == RULE_IDS


@pytest.mark.parametrize("rule", RULE_IDS)
def test_each_rule_lists_scenarios_that_exist_and_carry_its_marker(rule: str) -> None:
    listed = _listed(_sections()[rule])
    assert listed, f"{rule} lists no scenario"
    scenarios = _scenarios()
    missing = sorted(set(listed) - set(scenarios))
    assert not missing, f"{rule} lists scenarios that do not exist: {missing}"
    unmarked = sorted(name for name in listed if rule not in scenarios[name][0])
    assert not unmarked, f"{rule} lists scenarios without @pytest.mark.san_rule({rule!r}): {unmarked}"


@pytest.mark.parametrize("rule", RULE_IDS)
def test_each_rule_lists_every_scenario_marked_with_it(rule: str) -> None:
    by_rule: defaultdict[str, set[str]] = defaultdict(set)
    for name, (rules, _) in _scenarios().items():
        for r in rules:
            by_rule[r].add(name)
    left_out = sorted(by_rule[rule] - set(_listed(_sections()[rule])))
    assert not left_out, f"CONTRACT.md's {rule} does not list these scenarios marked with it: {left_out}"


def test_listed_capabilities_are_what_the_scenarios_require() -> None:
    scenarios = _scenarios()
    wrong = []
    for rule, section in _sections().items():
        for name, needs in _listed(section).items():
            required = scenarios[name][1] if name in scenarios else set()
            if (needs or set()) != required:
                wrong.append(f"{rule} {name}: says {sorted(needs or [])}, requires {sorted(required)}")
    assert not wrong, "\n".join(wrong)


def test_the_contract_names_every_error_code_with_its_value() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    for code in pytest_san.WsaError:
        assert f"{code.name} {int(code)}" in text, code


def test_the_contract_shows_the_reference_order_of_the_code() -> None:
    """CONTRACT.md's table of the reference order is pytest_san.spi.checks.CHECKS, row for row
    (pytest_san.contract_table renders it)."""
    lines = CONTRACT.read_text(encoding="utf-8").splitlines()
    table = contract_table.markdown_table()
    starts = [i for i, line in enumerate(lines) if line == table[0]]
    assert len(starts) == 1, "CONTRACT.md must hold the reference order once (contract_table.markdown_table())"
    rows = []
    for line in lines[starts[0]:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert rows == table, "CONTRACT.md's reference order differs from pytest_san/spi/checks.py"


def test_every_call_checks_the_socket_and_its_rows_in_one_order() -> None:
    """One order for every call: each call's rows are CHECKS filtered, every call checks its socket, and a row
    names only calls there are."""
    for call, rows in checks.ORDER.items():
        assert [c.id for c in rows] == [c.id for c in checks.CHECKS if call in c.calls]
        assert "socket" in [c.id for c in rows]
    assert {call for c in checks.CHECKS for call in c.calls} == set(checks.CALLS)
    assert checks.first("rdma_write", ["queue", "entry.owner", "descriptor"]) == "entry.owner"
    assert checks.answer("register_rdma_memory", "descriptor_size.small") == "WSAEFAULT"
    with pytest.raises(KeyError):
        checks.answer("send", "descriptor")
