"""Which scenarios run: ``--san-rules`` keeps the tests of some rules, ``--san-sample N`` about N of each rule.

A sample is for a pipeline with a fixed budget (CI's second lab): every rule still gets scenarios that can run
on this backend, drawn with ``--san-sample-seed`` so that a red run can be repeated, and a scenario kept for one
rule counts for each rule it is marked with. The whole suite is what judges a provider; a sample only says that
nothing obvious broke.
"""

from __future__ import annotations

import random

import pytest

from ..report import RULE_IDS, is_rule_id
from .capabilities import missing_reason
from .hooks import get_backend, marker_args

SAMPLE_KEY = pytest.StashKey[str]()
"""What the sample kept, for the header line after collection."""


def rules_of(item: pytest.Item) -> set[str]:
    return {str(arg) for arg in marker_args(item, "san_rule")}


def runnable(config: pytest.Config, item: pytest.Item) -> bool:
    """Whether the backend has every capability the item requires (else it would only be skipped)."""
    required = [str(cap) for cap in dict.fromkeys(marker_args(item, "san_requires"))]
    return not required or missing_reason(config, item, get_backend(config), required) is None


def by_rules(items: list[pytest.Item], wanted: str) -> list[pytest.Item]:
    rules = {rule.strip() for rule in wanted.split(",") if rule.strip()}
    unknown = sorted(rule for rule in rules if not is_rule_id(rule))
    if unknown:
        raise pytest.UsageError(f"--san-rules {wanted}: unknown rule id(s) {', '.join(unknown)} (known: R1..R14, "
                                "P1..P5)")
    return [item for item in items if rules & rules_of(item)]


def sample(config: pytest.Config, items: list[pytest.Item], per_rule: int, seed: int) -> list[pytest.Item]:
    """``per_rule`` scenarios for each rule (or all it has), runnable ones first, drawn in a seeded order; tests
    marked with no rule are kept. A scenario drawn for one rule counts for each rule it is marked with, so the rules
    with the fewest scenarios draw first, and a rule gets more than ``per_rule`` only through another's draw."""
    kept: dict[int, pytest.Item] = {}
    marked_with = {rule: sorted((item for item in items if rule in rules_of(item)), key=lambda item: item.nodeid)
                   for rule in RULE_IDS}
    for rule in sorted(RULE_IDS, key=lambda rule: len(marked_with[rule])):
        marked = marked_with[rule]
        random.Random(f"{seed}:{rule}").shuffle(marked)
        marked.sort(key=lambda item: not runnable(config, item))  # stable: the seeded order within each
        have = sum(rule in rules_of(item) for item in kept.values())
        for item in marked:
            if have >= per_rule:
                break
            if id(item) not in kept:
                kept[id(item)] = item
                have += 1
    return [item for item in items if id(item) in kept or not rules_of(item)]


@pytest.hookimpl(trylast=True)  # after -k and -m: a sample is drawn from what they kept
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = config.getoption("san_rules")
    keep = by_rules(items, str(wanted)) if wanted else list(items)
    per_rule = config.getoption("san_sample")
    if per_rule is not None:
        seed = int(config.getoption("san_sample_seed"))
        sampled = sample(config, keep, per_rule, seed)
        config.stash[SAMPLE_KEY] = (f"san sample: {len(sampled)} of {len(keep)} tests, {per_rule} a rule "
                                    f"(--san-sample {per_rule} --san-sample-seed {seed})")
        keep = sampled
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    return config.stash.get(SAMPLE_KEY, None)
