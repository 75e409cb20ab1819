"""The reference model in ``san-hil nightly``: its budget, its pytest arguments, its results.

Per host set, after the suite, one ``pytest --pyargs pytest_san.model`` run on the same hosts (issue 11:
nightly runs at least 2,000 sequences of at least 20 steps in all, so by default each of n sets runs
ceil(2000 / n)). ``model_args`` is what that run gets beyond the common nightly arguments;
``model_report`` is report.json's ``"model"`` section; ``render_model`` its part of summary.md.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hil.nightly.runs import FAIL, PASS, SetRun, _load_json

__all__ = ["STEPS", "TOTAL_SEQUENCES", "ModelOptions", "model_args", "model_report", "plugin_args", "render_model"]

TOTAL_SEQUENCES = 2000  # in all host sets together (issue 11: nightly runs at least 2,000)
STEPS = 20  # steps per sequence (issue 11: at least 20)
_LOG_LINES = 15


@dataclass(frozen=True)
class ModelOptions:
    """``--model-*``: the model's budget in a nightly run."""

    sequences: int = TOTAL_SEQUENCES  # in all, split evenly over the host sets
    steps: int = STEPS
    deadline: float | None = None  # seconds, per host set: no sequence starts after it
    seed: int | None = None  # None: each run draws its own (reported, so it replays)
    differential: bool = False

    def per_set(self, sets: int) -> int:
        return math.ceil(self.sequences / max(sets, 1))


def plugin_args(pytest_args: Sequence[str]) -> list[str]:
    """The ``-p NAME`` of the suite's pytest arguments: a provider plugged in (or a plugin disabled) is so
    for the model too; the rest (test paths, ``-k``) selects suite tests and would empty the model run."""
    out: list[str] = []
    args = list(pytest_args)
    for i, arg in enumerate(args):
        if arg == "-p" and i + 1 < len(args):
            out += ["-p", args[i + 1]]
        elif arg.startswith("-p") and len(arg) > 2 and not arg.startswith("-p="):
            out.append(arg)
    return out


def model_args(options: ModelOptions, per_set: int, pytest_args: Sequence[str]) -> list[str]:
    args = [f"--san-model-sequences={per_set}", f"--san-model-steps={options.steps}"]
    if options.deadline is not None:
        args.append(f"--san-model-deadline={options.deadline:g}")
    if options.seed is not None:
        args.append(f"--san-model-seed={options.seed}")
    if options.differential:
        args.append("--san-model-differential")
    return args + plugin_args(pytest_args)


# --- report.json ----------------------------------------------------------------------------------------


def _log_tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-_LOG_LINES:])


def replay_command(run: SetRun, inventory: str, group: str, seed: int, sequences: int, steps: int,
                   differential: bool, plugins: Sequence[str] = ()) -> str:
    """The pytest command that replays ``sequences`` of a set's model run with ``seed`` (and its plugins)."""
    argv = ["pytest", "--pyargs", "pytest_san.model", "--san-backend=hil", f"--san-inventory={inventory}",
            f"--san-group={group}", f"--san-hosts={','.join(run.set.names)}", f"--san-model-seed={seed}",
            f"--san-model-sequences={sequences}", f"--san-model-steps={steps}"]
    return shlex.join(argv + (["--san-model-differential"] if differential else []) + list(plugins))


def set_model(run: SetRun, options: ModelOptions, per_set: int, inventory: str, group: str,
              plugins: Sequence[str] = ()) -> dict[str, Any]:
    """One set's model result: its report's ``"model"`` section, how pytest ended, how to replay it."""
    report = _load_json(run.report)
    model = report.get("model") if isinstance(report, dict) else None
    model = model if isinstance(model, dict) else {}
    divergences = list(model.get("divergences", []))
    seeds = [int(s) for s in model.get("seeds", [])]
    failures = _load_json(run.failures)
    diagnostics: dict[str, str] = {}  # host -> what the hil plugin gathered when the model test failed
    for failure in failures if isinstance(failures, list) else []:
        diagnostics.update(failure.get("diagnostics", {}))
    ok = run.exit_status == 0 and bool(model) and not divergences
    entry: dict[str, Any] = {
        "hosts": run.set.names,
        "status": "passed" if ok else "diverged" if divergences else "failed",
        "exit_status": run.exit_status,
        "duration": round(run.duration, 3),
        "backend": model.get("backend"),
        "sequences": int(model.get("sequences", 0)),
        "steps": int(model.get("steps", 0)),
        "budget": {"sequences": per_set, "steps": options.steps, "deadline": options.deadline},
        "regressions": int(model.get("regressions", 0)),
        "seed": seeds[0] if seeds else None,
        "differential": bool(model.get("differential", options.differential)),
        "divergences": divergences,
        "costs": list(model.get("costs", [])),
        "alternatives": dict(model.get("alternatives", {})),
        "diagnostics": diagnostics,
        "log": str(run.log),
        "html": str(run.html) if run.html.is_file() else None,
        "error": None if ok or divergences else _log_tail(run.log),
    }
    if entry["seed"] is not None:
        # Enough sequences to reach the last divergence again (sequence k replays from seed/k), else all.
        reach = max((int(d.get("sequence", -1)) + 1 for d in divergences), default=per_set) or 1
        entry["replay"] = replay_command(run, inventory, group, entry["seed"], reach, options.steps,
                                         entry["differential"], plugins)
    return entry


def model_report(runs: Sequence[SetRun], options: ModelOptions, per_set: int, inventory: str, group: str,
                 plugins: Sequence[str] = ()) -> dict[str, Any]:
    """report.json's ``"model"``: the verdict, the totals, the budget and each set's result."""
    sets = {run.set.name: set_model(run, options, per_set, inventory, group, plugins) for run in runs}
    return {
        "status": "passed" if all(e["status"] == "passed" for e in sets.values()) else "failed",
        "sequences": sum(e["sequences"] for e in sets.values()),
        "steps": sum(e["steps"] for e in sets.values()),
        "divergences": sum(len(e["divergences"]) for e in sets.values()),
        "budget": {"sequences": options.sequences, "per_set": per_set, "steps": options.steps,
                   "deadline": options.deadline, "seed": options.seed, "differential": options.differential},
        "sets": sets,
    }


# --- summary.md -----------------------------------------------------------------------------------------


def _title(div: Mapping[str, Any]) -> str:
    """As the model's terminal output titles it (pytest_san.model.divergence.Divergence.title)."""
    kind = div.get("kind")
    shown = len([line for line in div.get("steps", []) if line.lstrip()[:1].isdigit()])
    where = f"seed {div.get('seed')}, sequence {div.get('sequence')}, {shown} steps after shrinking"
    if kind == "regression":
        where = "a past divergence replayed (pytest_san/model/regressions.py)"
    elif kind == "flaky":
        where = f"seed {div.get('seed')}, sequence {div.get('sequence')}; did not reproduce"
    return f"{div.get('side')}: {div.get('category')} after a {div.get('step')} step ({where}; {kind})"


def _fence(lines: Sequence[str]) -> str:
    body = "\n".join(lines)
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", body)), default=0))
    return f"{fence}text\n{body}\n{fence}"


def render_model(report: Mapping[str, Any]) -> list[str]:
    """summary.md's "Reference model" section."""
    model = report.get("model")
    if not model:
        return ["## Reference model", "", report.get("model_note") or "The model was not run.", ""]
    sets: Mapping[str, Mapping[str, Any]] = model["sets"]
    budget = model["budget"]
    diverged = [name for name, e in sets.items() if e["divergences"]]
    if model["status"] == "passed":
        verdict = f"{PASS} no divergence"
    elif diverged:
        verdict = f"{FAIL} {model['divergences']} divergence(s) on {', '.join(diverged)}"
    else:
        verdict = f"{FAIL} failed"
    lines = [f"## Reference model: {verdict}", "",
             f"{model['sequences']} sequences, {model['steps']} steps in all ({len(sets)} host set(s); budget "
             f"{budget['per_set']} sequences of {budget['steps']} steps each"
             + (f", {budget['deadline']:g} s at most" if budget["deadline"] is not None else "")
             + (", differential: every step also on a fresh emulator" if budget["differential"] else "") + ").",
             "", "| host | result | backend | sequences | steps | divergences | seed |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for name, e in sets.items():
        result = {"passed": f"{PASS} passed", "diverged": f"{FAIL} diverged"}.get(
            e["status"], f"{FAIL} failed (exit {e['exit_status']})")
        seed = f"`{e['seed']}`" if e["seed"] is not None else "?"
        lines.append(f"| **{name}** | {result} | {e['backend'] or '?'} | {e['sequences']} | {e['steps']} | "
                     f"{len(e['divergences'])} | {seed} |")
    lines += ["", "Replay a host set's run with its seed: `san-hil nightly [...] --model-seed SEED`, or "
                  "`pytest --pyargs pytest_san.model [...] --san-model-seed SEED` (each divergence below gives the "
                  "whole command; report.json too).", ""]
    for name, e in sets.items():
        for i, div in enumerate(e["divergences"], 1):
            lines += [f"### {name}: divergence {i} of {len(e['divergences'])}", "", f"**{_title(div)}**", "",
                      f"> {div.get('message', '')}", "", _fence([str(s) for s in div.get("steps", [])]), ""]
        if e["divergences"] and e.get("replay"):
            lines += [f"Replay: `{e['replay']}`", ""]
        if e["status"] == "failed":
            lines += [f"### {name}: the model run failed (pytest exit {e['exit_status']})", "",
                      _fence((e.get("error") or f"see {e['log']}").splitlines()), "",
                      f"Full output: `{e['log']}`", ""]
        for host, text in e.get("diagnostics", {}).items():
            lines += [f"<details><summary>host diagnostics: {host}</summary>", "", _fence(text.splitlines()), "",
                      "</details>", ""]
    return lines
