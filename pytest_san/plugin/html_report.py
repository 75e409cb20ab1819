"""pytest-san in pytest-html's report (``pytest --html=PATH``), through pytest-html's own hooks only.

- a *Rules* column in the results table: the rule ids each test checks (R11 too where its teardown found a leak);
- in the summary: the backend, its capabilities, the per-rule table (passed/failed/skipped/deviating, as
  ``--san-report``) and the declared deviations;
- on the reference model's test: its verdict and each divergence, shrunk, as the test's extra; on each of the
  suite's per-rule model tests, the divergences that break its rule.

The hooks are optional: without pytest-html nothing here runs, and pytest-html is never imported here.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from html import escape
from typing import Any

import pytest

from ..report import OUTCOMES, RULE_IDS, ConformanceReport, ModelResult, catalog_order, leak_rules
from .hooks import REPORT_KEY, marker_args
from .model import FIXTURE, SUITE_MODEL_KEY

_STYLE = ("<style>table.san-rules{border-collapse:collapse;margin:.5em 0}"
          "table.san-rules th,table.san-rules td{border:1px solid #e6e6e6;padding:2px 8px;text-align:right}"
          "table.san-rules tr.san-idle{color:#999}table.san-rules tr.san-has-failed td.san-failed{color:red;"
          "font-weight:bold}</style>")
RULES_COLUMN = "rules"  # pytest-html sorts and filters on the cell class col-<name> (its app.js)
_MODEL_BEFORE = pytest.StashKey[tuple[int, int, int]]()
"""On an item: where the session's model result stood when the test's call began."""


def _html_report(config: pytest.Config) -> bool:
    return bool(config.getoption("htmlpath", None))


def rules_of(report: Any) -> list[str]:
    """The rule ids a phase report of a SAN test carries (none for other tests)."""
    rules = list(getattr(report, "san_rules", None) or [])
    rules += leak_rules(getattr(report, "san_leaks", None) or [])
    return list(catalog_order(rules))


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_table_header(cells: list[str]) -> None:
    cells.insert(2, f'<th class="sortable" data-column-type="{RULES_COLUMN}">Rules</th>')


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_table_row(report: Any, cells: list[str]) -> None:
    if cells:  # another plugin may have emptied them: pytest-html then drops the row
        cells.insert(2, f'<td class="col-{RULES_COLUMN}">{escape(" ".join(rules_of(report)))}</td>')


def _title(entry: dict[str, Any]) -> str:
    """A known difference's line names it; its texts are the item's tooltip."""
    if entry.get("kind", "declared") == "declared":
        return ""
    return f' title="{escape(entry["what"])} Instead: {escape(str(entry.get("instead")))}"'


def summary_html(report: ConformanceReport) -> str:
    """The summary's SAN part: backend, capabilities, every rule's counts, the model's line, the declared
    deviations."""
    counts = report.counts()
    caps = ", ".join(sorted(report.capabilities)) or "(none)"
    rows = []
    for rule in RULE_IDS:
        row = counts[rule]
        kind = "san-idle" if not any(row.values()) else "san-has-failed" if row["failed"] else "san-exercised"
        cells = "".join(f'<td class="san-{outcome}">{row[outcome]}</td>' for outcome in OUTCOMES)
        rows.append(f'<tr data-rule="{rule}" class="{kind}"><th scope="row">{rule}</th>{cells}</tr>')
    head = "".join(f"<th>{outcome}</th>" for outcome in OUTCOMES)
    parts = [
        _STYLE,
        '<div class="san-summary" id="san-summary">',
        f'<p>SAN backend: <strong class="san-backend">{escape(report.backend or "(none)")}</strong>; '
        f'capabilities: <span class="san-capabilities">{escape(caps)}</span></p>',
        '<table class="san-rules" id="san-rules">',
        f"<thead><tr><th>rule</th>{head}</tr></thead>",
        f"<tbody>{''.join(rows)}</tbody></table>",
    ]
    if report.model is not None:
        parts.append(f'<p class="san-model-line">{escape(report.model.lines()[0][0])}</p>')
    if report.deviations:
        items = "".join(f'<li data-rule="{escape(d["rule"])}" data-observed="{str(d["observed"]).lower()}" '
                        f'data-kind="{escape(d.get("kind", "declared"))}"{_title(d)}>{escape(line)}</li>'
                        for d, (line, _) in zip(report.deviations, report.deviation_lines(), strict=True))
        parts.append(f'<ul class="san-deviations" id="san-deviations">{items}</ul>')
    parts.append("</div>")
    return "\n".join(parts)


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_summary(prefix: list[str], summary: list[str], postfix: list[str],
                                session: pytest.Session) -> None:
    report = session.config.stash.get(REPORT_KEY, None)
    if report is not None and report.tests:
        prefix.append(summary_html(report))


def _model_position(config: pytest.Config) -> tuple[int, int, int]:
    model = config.stash[REPORT_KEY].model
    return (0, 0, 0) if model is None else (model.sequences, len(model.divergences), len(model.seeds))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    if _html_report(item.config) and REPORT_KEY in item.config.stash:
        item.stash[_MODEL_BEFORE] = _model_position(item.config)
    return (yield)


def model_html(model: ModelResult, before: tuple[int, int, int]) -> str | None:
    """The verdict of the model runs one test made (what was added to ``model`` since ``before``), with each
    divergence's shrunk steps; None when the test ran no model."""
    sequences, first_divergence, first_seed = before
    ran = model.sequences - sequences
    divergences = model.divergences[first_divergence:]
    if ran <= 0 and not divergences:
        return None
    return _verdict_html(model.backend, divergences, ran, model.seeds[first_seed:], "")


def rule_model_html(model: ModelResult, rules: Sequence[str]) -> str:
    """The suite's model run as one of its per-rule tests shows it: the divergences that break ``rules``."""
    divergences = [d for d in model.divergences if set(d.get("rules", ())) & set(rules)]
    return _verdict_html(model.backend, divergences, model.sequences, model.seeds, " breaking " + ", ".join(rules))


def _verdict_html(backend: str, divergences: Sequence[dict[str, Any]], ran: int, seeds: Sequence[int],
                  breaking: str) -> str:
    verdict = "diverged" if divergences else "passed"
    mark = f"\u2717 {len(divergences)} divergence(s)" if divergences else "\u2713 no divergence"
    parts = [f'<div class="san-model" data-verdict="{verdict}">',
             f"<p><strong>Reference model on {escape(backend or '(none)')}</strong>: {mark}{escape(breaking)} in "
             f"{ran} sequence(s); seed {escape(', '.join(str(seed) for seed in seeds))} (replay: --san-model-seed)"
             "</p>"]
    for number, div in enumerate(divergences, 1):
        rules = ", ".join(div.get("rules", ()))
        title = (f"divergence {number} of {len(divergences)}: {div.get('side')}: {div.get('category')} after a "
                 f"{div.get('step')} step (seed {div.get('seed')}, sequence {div.get('sequence')}, {div.get('kind')})"
                 + (f", breaking {rules}" if rules else ""))
        steps = "\n".join(str(line) for line in div.get("steps", ()))
        parts += [f'<p class="san-divergence">{escape(title)}</p>',
                  f'<p class="san-divergence-message">{escape(str(div.get("message", "")))}</p>',
                  f'<pre class="san-divergence-steps">{escape(steps)}</pre>']
    parts.append("</div>")
    return "\n".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    before = item.stash.get(_MODEL_BEFORE, None)
    suite_model = item.config.stash.get(SUITE_MODEL_KEY, None)
    if call.when == "call" and before is not None:
        model = item.config.stash[REPORT_KEY].model
        content = None if model is None else model_html(model, before)
        if suite_model is not None and FIXTURE in getattr(item, "fixturenames", ()):  # one rule's test of the suite
            content = rule_model_html(suite_model, [str(rule) for rule in marker_args(item, "san_rule")])
        if content is not None:
            # pytest-html's format for an extra (pytest_html.extras.html), written out: nothing imports it here.
            extra = {"name": "SAN model", "format_type": "html", "content": content, "mime_type": None,
                     "extension": None}
            report.extras = [*getattr(report, "extras", []), extra]
    return report
