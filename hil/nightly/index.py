"""``san-hil nightly``'s ``index.html``: the whole inventory's night on one page.

A static page, no script and nothing fetched, so it opens as it is from a CI artifact or a file share:

- the verdict (suite, model, bandwidth);
- the rule x host-set matrix: a cell per rule and host set, linking to that run's pytest-html report and
  carrying the counts of that run's ``--san-report`` JSON (``data-passed``, ``data-failed``, ``data-skipped``,
  ``data-deviating``: failures a declared deviation explains);
  its last row is the reference model's result per host set, linking to the model run's report;
- the model per host set (backend, sequences, steps, seed, each divergence's shrunk steps, the replay command);
- the bandwidth plot inline (a ``data:`` URI) with its numbers and the ratio harness / ib_write_bw;
- the host diagnostics of every failure.

It is made from report.json's dict (``render_index``), as summary.md is; UTF-8.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from hil.measure.bandwidth import missing_sizes, ratios, size_label
from hil.nightly.model import _title
from hil.nightly.results import verdict_parts
from hil.nightly.runs import DEVIATING, FAIL, NONE, PASS
from pytest_san.report import OUTCOMES

__all__ = ["render_index", "write_index"]

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 .passed, td.passed, .verdict .passed { color: #1a7f37; } .verdict .none { color: #666; }
h1 .failed, td.failed, .verdict .failed { color: #cf222e; }
table { border-collapse: collapse; margin: .6em 0 1.2em; }
th, td { border: 1px solid #d0d7de; padding: 3px 9px; text-align: center; }
th { background: #f6f8fa; } th.rule { text-align: left; }
td.deviating { color: #9a6700; } td.skipped, td.none { color: #888; }
td a { color: inherit; text-decoration: none; display: block; }
tr.model td, tr.model th { border-top: 2px solid #888; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; font-size: 85%; }
img.bandwidth { max-width: 100%; border: 1px solid #d0d7de; }
.muted { color: #666; font-size: 90%; }
"""


def _link(path: str | None, out: Path) -> str | None:
    """``path`` relative to the page (so the folder moves as a whole), or None when there is no such file."""
    if not path or not Path(path).is_file():
        return None
    return Path(os.path.relpath(path, out)).as_posix()


def _cell(content: str, href: str | None, **attrs: Any) -> str:
    data = "".join(f' {key.rstrip("_").replace("_", "-")}="{escape(str(value))}"' for key, value in attrs.items())
    inner = f'<a href="{escape(href)}">{content}</a>' if href else content
    return f"<td{data}>{inner}</td>"


def _rule_cell(rule: str, name: str, counts: Mapping[str, Any] | None, href: str | None) -> str:
    c = {k: int((counts or {}).get(k, 0)) for k in OUTCOMES}
    ran = c["passed"] + c["failed"] + c["deviating"]
    if c["failed"]:
        kind, text = "failed", f"{FAIL} {c['failed']}/{ran}"
    elif c["deviating"]:
        kind, text = "deviating", f"{DEVIATING} {c['deviating']}/{ran}"
    elif c["passed"]:
        kind, text = "passed", f"{PASS} {c['passed']}"
    elif c["skipped"]:
        kind, text = "skipped", f"{NONE} {c['skipped']} skipped"
    else:
        kind, text = "none", NONE
    title = f"{rule} on {name}: " + ", ".join(f"{c[k]} {k}" for k in OUTCOMES)
    return _cell(escape(text), href, class_=kind, data_rule=rule, data_set=name, data_passed=c["passed"],
                 data_failed=c["failed"], data_skipped=c["skipped"], data_deviating=c["deviating"], title=title)


def _model_cell(name: str, entry: Mapping[str, Any] | None, href: str | None) -> str:
    if entry is None:
        return _cell(NONE, None, class_="none", data_set=name, data_model="not run")
    status = entry["status"]
    if status == "passed":
        kind, text = "passed", f"{PASS} {entry['sequences']} sequences"
    elif status == "diverged":
        kind, text = "failed", f"{FAIL} {len(entry['divergences'])} divergence(s)"
    else:
        kind, text = "failed", f"{FAIL} failed (exit {entry['exit_status']})"
    return _cell(escape(text), href, class_=kind, data_set=name, data_model=status,
                 title=f"reference model on {name}: {status}, seed {entry.get('seed')}")


def _matrix(report: Mapping[str, Any], out: Path) -> list[str]:
    sets: Mapping[str, Mapping[str, Any]] = report["hosts"]
    model_sets: Mapping[str, Mapping[str, Any]] = (report.get("model") or {}).get("sets", {})
    head = "".join(f'<th scope="col" data-set="{escape(n)}">{escape(n)}</th>' for n in sets)
    lines = ['<table class="matrix" id="matrix">', f'<thead><tr><th class="rule">rule</th>{head}</tr></thead>',
             "<tbody>"]
    results = "".join(_cell(f"{PASS} passed" if e["status"] == "passed" else f"{FAIL} exit {e['exit_status']}",
                            _link(e.get("html"), out), class_=e["status"], data_set=n, data_suite=e["status"])
                      for n, e in sets.items())
    lines.append(f'<tr class="suite"><th class="rule" scope="row">suite</th>{results}</tr>')
    for rule in report.get("rules", []):
        cells = "".join(_rule_cell(rule, n, e["rules"].get(rule), _link(e.get("html"), out)) for n, e in sets.items())
        lines.append(f'<tr data-rule="{rule}"><th class="rule" scope="row">{rule}</th>{cells}</tr>')
    model = "".join(_model_cell(n, model_sets.get(n), _link((model_sets.get(n) or {}).get("html"), out))
                    for n in sets)
    lines += [f'<tr class="model"><th class="rule" scope="row">model</th>{model}</tr>', "</tbody></table>",
              f'<p class="muted">{PASS} n: every test of the rule passed (n tests) &middot; {FAIL} f/n: f of the n '
              f"tests that ran failed &middot; {NONE}: not run there (skipped: a capability missing). A cell opens "
              "that run's pytest-html report.</p>"]
    return lines


def _verdict(report: Mapping[str, Any]) -> str:
    kinds = {True: "passed", False: "failed", None: "none"}
    parts = [f'<span class="{kinds[ok]}">{escape(what)}: {escape(text)}</span>'
             for what, ok, text in verdict_parts(report)]
    return f'<p class="verdict">{" &middot; ".join(parts)}</p>'


def _pre(text: str) -> str:
    return f"<pre>{escape(text.rstrip())}</pre>"


def _model(report: Mapping[str, Any]) -> list[str]:
    model = report.get("model")
    lines = ['<h2 id="model">Reference model</h2>']
    if not model:
        return [*lines, f"<p>{escape(report.get('model_note') or 'The model was not run.')}</p>"]
    budget = model["budget"]
    lines += [f"<p>{model['sequences']} sequences, {model['steps']} steps in all; budget {budget['per_set']} "
              f"sequences of {budget['steps']} steps per host set"
              + (", differential" if budget["differential"] else "") + ".</p>",
              '<table class="model-sets"><thead><tr><th>host set</th><th>result</th><th>backend</th><th>sequences'
              "</th><th>steps</th><th>divergences</th><th>seed</th></tr></thead><tbody>"]
    for name, e in model["sets"].items():
        kind = "passed" if e["status"] == "passed" else "failed"
        lines.append(f'<tr data-set="{escape(name)}"><th>{escape(name)}</th><td class="{kind}">{escape(e["status"])}'
                     f"</td><td>{escape(str(e['backend']))}</td><td>{e['sequences']}</td><td>{e['steps']}</td>"
                     f"<td>{len(e['divergences'])}</td><td>{escape(str(e['seed']))}</td></tr>")
    lines.append("</tbody></table>")
    for name, e in model["sets"].items():
        for number, div in enumerate(e["divergences"], 1):
            lines += [f'<h3>{escape(name)}: divergence {number} of {len(e["divergences"])}</h3>',
                      f'<p class="divergence"><strong>{escape(_title(div))}</strong></p>',
                      f"<blockquote>{escape(str(div.get('message', '')))}</blockquote>",
                      _pre("\n".join(str(s) for s in div.get("steps", [])))]
        if e["divergences"] and e.get("replay"):
            lines.append(f"<p>Replay: <code>{escape(e['replay'])}</code></p>")
        if e["status"] == "failed":
            lines += [f"<h3>{escape(name)}: the model run failed (pytest exit {e['exit_status']})</h3>",
                      _pre(e.get("error") or f"see {e['log']}")]
    return lines


def _diagnostics(items: Mapping[str, str]) -> list[str]:
    return [f"<details><summary>host diagnostics: {escape(host)}</summary>{_pre(text)}</details>"
            for host, text in items.items()]


def _failures(report: Mapping[str, Any]) -> list[str]:
    lines = ['<h2 id="failures">Failures and host diagnostics</h2>']
    found = False
    for name, entry in report["hosts"].items():
        if entry["status"] == "passed":
            continue
        found = True
        if not entry["failures"]:
            lines += [f"<h3>{escape(name)}: pytest exited {entry['exit_status']} without a failed test</h3>",
                      _pre(entry.get("error") or f"see {entry['log']}")]
        for failure in entry["failures"]:
            rules = f" ({', '.join(failure['rules'])})" if failure["rules"] else ""
            lines += [f'<h3 class="failure" data-set="{escape(name)}">{escape(name)}: '
                      f"<code>{escape(failure['nodeid'])}</code>{escape(rules)}</h3>",
                      f"<blockquote>{escape(failure['reason'] or '(no message)')}</blockquote>",
                      *_diagnostics(failure["diagnostics"])]
    for name, e in ((report.get("model") or {}).get("sets") or {}).items():
        if e.get("diagnostics"):
            found = True
            lines += [f"<h3>{escape(name)}: the model's failure</h3>", *_diagnostics(e["diagnostics"])]
    return lines if found else [*lines, "<p>None.</p>"]


def _bandwidth(report: Mapping[str, Any], png: Path | None) -> list[str]:
    lines = ['<h2 id="bandwidth">RDMA write bandwidth</h2>']
    bandwidth = report.get("bandwidth")
    if report.get("bandwidth_note"):
        lines.append(f"<p>{escape(report['bandwidth_note'])}</p>")
    if not bandwidth:
        return lines
    if png is not None and png.is_file():
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        lines.append(f'<img class="bandwidth" alt="RDMA write bandwidth: harness and ib_write_bw, and their ratio, '
                     f'per host set" src="data:image/png;base64,{data}">')
    for name, entry in bandwidth.items():
        harness = [(p["bytes"], p["gbps"]) for p in entry.get("harness", [])]
        perftest = [(p["bytes"], p["gbps"]) for p in entry.get("ib_write_bw", [])]
        theirs, ratio = dict(perftest), dict(ratios(harness, perftest))
        lines += [f'<h3>{escape(name)}</h3><table class="bandwidth" data-set="{escape(name)}"><thead><tr>'
                  "<th>message</th><th>harness (Gb/s)</th><th>ib_write_bw (Gb/s)</th><th>harness / ib_write_bw</th>"
                  "</tr></thead><tbody>"]
        ours = dict(harness)
        for size in sorted(set(ours) | set(theirs)):
            cells = [_gbps(ours.get(size)), _gbps(theirs.get(size)), _gbps(ratio.get(size))]
            lines.append(f'<tr data-bytes="{size}"><th>{size_label(size)}</th>'
                         + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        lines.append("</tbody></table>")
        for tool, sizes in missing_sizes(harness, perftest).items():
            if sizes and (harness if tool == "ib_write_bw" else perftest):
                lines.append(f"<p>{tool} has no result at {escape(', '.join(size_label(s) for s in sizes))}.</p>")
        for key in ("harness_error", "ib_write_bw_error", "ib_write_bw_missing"):
            if entry.get(key):
                lines.append(f'<p class="failed">{escape(key.replace("_", " "))}: {escape(entry[key])}</p>')
    return lines


def _gbps(value: float | None) -> str:
    return NONE if value is None else f"{value:.3g}"


def render_index(report: Mapping[str, Any], out: Path, png: Path | None = None) -> str:
    """index.html for the nightly whose report.json is ``report``, written into ``out`` (links are relative)."""
    ok = report["status"] == "passed"
    sets: Sequence[str] = list(report["hosts"])
    title = f"pytest-san nightly: {PASS + ' passed' if ok else FAIL + ' FAILED'}"
    shown = escape(" ".join(report["pytest_args"]))
    args = f" &middot; pytest args <code>{shown}</code>" if report["pytest_args"] else ""
    body = [
        f'<h1><span class="{"passed" if ok else "failed"}">{escape(title)}</span></h1>',
        f'<p class="muted">{escape(report["started"])} ({report["duration"]:.0f} s) &middot; inventory '
        f"<code>{escape(report['inventory'])}</code> &middot; group <code>{escape(report['group'])}</code> &middot; "
        f"{len(sets)} host set(s){args} &middot; also: <a href=\"summary.md\">summary.md</a>, "
        '<a href="report.json">report.json</a>, <a href="junit.xml">junit.xml</a></p>',
        _verdict(report),
        '<h2 id="rules">Rules by host set</h2>',
        *_matrix(report, out),
        *_model(report),
        *_bandwidth(report, png),
        *_failures(report),
    ]
    return "\n".join(['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>", *body,
                      "</body></html>", ""])


def write_index(report: Mapping[str, Any], out: Path) -> Path:
    png = out / "bandwidth.png"
    path = out / "index.html"
    path.write_text(render_index(report, out, png if report.get("bandwidth_png") else None), encoding="utf-8")
    return path
