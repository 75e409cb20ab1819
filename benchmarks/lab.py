"""The Soft-RoCE lab side by side: boot time, the suite's wall time on it, RDMA write bandwidth (issue 4, item 5).

Run against a running lab (``san-hil lab up --hosts 2 --inventory-out /tmp/lab.yaml``)::

    python benchmarks/lab.py --inventory /tmp/lab.yaml [--seconds 10] [--no-suite] [--no-profile] [--json out.json]

or let it boot (and afterwards tear down) a lab of its own in a fresh state directory::

    python benchmarks/lab.py --boot [--hosts 2] [--state-dir DIR] [san-hil lab up options after --up-args]

It prints, measured in one run:

a. the lab's boot time: with ``--boot`` the wall time of ``san-hil lab up``; otherwise the time the running
   lab's state records from its start to ready (``state.json`` is last written when ``up`` marks it ready);
b. the wall time of ``python -m pytest --pyargs pytest_san.scenarios --san-backend=hil --san-inventory=...``
   in a subprocess, with its outcome counts;
c. RDMA write bandwidth at 64 KiB between the first two guests: the harness (``hil.measure.bandwidth.measure_harness``:
   ``pytest_san.spi.burst.rdma_write_burst`` on the public API; on a verbs host the agent's process keeps 16
   writes in flight and reposts each as the previous completes, one controller round trip per burst) against
   ``ib_write_bw -s 65536 -n 2000 -F --report_gbits -d rxe0 -x 1`` (``hil.measure.bandwidth.measure_ib_write_bw``:
   server without an address on the second guest, client with the second guest's ``san_lab_address`` on
   the first), printed as the ratio harness / ib_write_bw
   with the goal >= 0.8, PASS or MISS;
e. the reference model on the lab's two hosts (``--model-sequences N`` sequences of 20 steps, seed 1,
   differential; 0 skips it), ``pytest --pyargs pytest_san.model`` in a subprocess: its time per sequence (the
   regressions' replay, once a run, timed apart by ``benchmarks/replaying.py``), cost line and round trips, beside
   the baseline's (``--baseline``; with ``--no-suite`` only the model, ``--rounds`` times, alternating);
f. with ``--delay-ms MS`` (benchmark only, ``benchmarks/delay.py``): the suites and the model again with a fixed
   delay on every controller-to-agent round trip, as a lab host that far away adds;
g. with ``--per-use`` (benchmark only, ``benchmarks/unbatched.py``): what each use of calls made together
   (``pytest_san.batch``: the switch's connect and progress, the scenarios' batches, the model's checks, the
   end of a test) saves, at 0 ms and at ``--delay-ms``: this tree's suite with every use, then with each one
   made one call at a time (the model's on the model run alone; its round trips are per sequence there).
   ``--suite-args`` passes pytest arguments to every suite run (``'--san-sample 2 --san-model-sequences 0'``
   for a quick seeded sample); ``--suite-goal`` the side-by-side goal (issue 29: 1.0, no worse);
d. where the harness's time goes (``--no-profile`` skips it): one agent round trip, one that reaches the
   verbs child, the post and the wait of single 64 KiB writes one at a time (a round trip each: what a
   test's own ``rdma_write(...).wait()`` costs), bursts at depths 1, 4, 16 and 32, and one large write for
   what the link moves.

The suite and the measurements run one after the other: each leases the hosts (the suite's agents hold the
leases while it runs), so they never share the guests. ``--check`` exits 1 when the ratio misses the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing: hil/ and pytest_san/ sit here
    sys.path.insert(0, str(ROOT))

import delay  # noqa: E402  (benchmarks/delay.py, beside this file)
import replaying  # noqa: E402  (benchmarks/replaying.py)
import unbatched  # noqa: E402  (benchmarks/unbatched.py)

from hil.controller.backend import Agent, HilBackend  # noqa: E402
from hil.inventory import HostConfig, load_inventory  # noqa: E402
from hil.lab.state import STATE_FILE, LabState  # noqa: E402
from hil.measure import bandwidth  # noqa: E402
from hil.measure.bandwidth import BandwidthError, address_of, measure_harness, timed_burst  # noqa: E402
from pytest_san import Access, Status, Switch  # noqa: E402

SIZE = 64 * 1024
SUITE = ("pytest_san.scenarios",)  # what a suite run runs, unless --tests names its tests
ITERATIONS = 2000
GOAL = 0.8
MIB = 1 << 20
DEPTHS = (1, 4, 16, 32)
LARGE = 16 << 20  # the single large write of the profile


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e9 if seconds > 0 else float("nan")


def mibps(gb_per_s: float) -> float:
    return gb_per_s * 1e9 / 8 / MIB


# --- a. boot time --------------------------------------------------------------------------------------


@dataclass
class Boot:
    seconds: float | None
    how: str


def recorded_boot(hosts: Sequence[HostConfig], inventory: Path) -> Boot:
    """The running lab's start-to-ready time, from its state directory (where ``up`` put the lab's key)."""
    key = hosts[0].key_file
    if key is None:
        return Boot(None, "not recorded: the inventory names no key file, so no lab state to read")
    directory = key.parent
    state = LabState.load(directory)
    if state is None:
        return Boot(None, f"not recorded: no {STATE_FILE} in {directory} (not a san-hil lab?)")
    if not state.ready:
        return Boot(None, f"not recorded: the lab in {directory} is not ready")
    ready_at = getattr(state, "ready_at", None)  # if the state ever records it
    if not isinstance(ready_at, (int, float)):
        ready_at = (directory / STATE_FILE).stat().st_mtime  # written last when `up` marked the lab ready
    note = "" if state.inventory is None or Path(state.inventory).resolve() == inventory.resolve() else (
        f"; its inventory is {state.inventory}")
    return Boot(ready_at - state.started, f"recorded by the lab in {directory}: start to ready{note}")


def boot_lab(hosts: int, state_dir: Path, inventory: Path, extra: Sequence[str]) -> Boot:
    argv = ["san-hil", "lab", "up", "--hosts", str(hosts), "--state-dir", str(state_dir),
            "--inventory-out", str(inventory), *extra]
    print(f"booting: {' '.join(argv)}", flush=True)
    began = time.perf_counter()
    result = subprocess.run(argv, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"lab up failed (exit {result.returncode}) after {took:.0f} s")
    return Boot(took, f"wall time of `san-hil lab up --hosts {hosts}` (kernel cache, keys, hub, guests, ports ACTIVE)")


# --- b. the suite on the lab ---------------------------------------------------------------------------


@dataclass
class Suite:
    seconds: float
    returncode: int
    summary: str
    failed_rules: list[str] = field(default_factory=list)
    round_trips: dict[str, Any] | None = None
    outcomes: dict[str, str] = field(default_factory=dict)


def _plugin_env(trips: Path, delay_ms: float, off: Sequence[str]) -> dict[str, str]:
    """The environment of a pytest run of either tree with this directory's plugins: round trips counted into
    ``trips``, ``delay_ms`` on every round trip, the uses in ``off`` one call at a time."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS")) and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent)  # these plugins only: each tree imports its own code
    env["SAN_ROUND_TRIPS_OUT"] = str(trips)
    env[delay.ENV] = str(delay_ms)
    env[unbatched.ENV] = ",".join(off)
    return env


def run_suite(inventory: Path, workdir: Path, timeout: float, python: str = sys.executable,
              label: str = "this tree", delay_ms: float = 0.0, extra: Sequence[str] = (),
              off: Sequence[str] = (), targets: Sequence[str] = SUITE) -> Suite:
    """The suite on the lab with ``python`` (this tree's, or a baseline's own venv), its round trips counted
    by benchmarks/roundtrips.py (loaded with -p, this directory on PYTHONPATH); ``delay_ms``: every round trip
    delayed that much (benchmarks/delay.py); ``extra``: more pytest arguments (``--suite-args``); ``off``: the
    uses of calls made together made one call at a time (benchmarks/unbatched.py, this tree only); ``targets``:
    what pytest runs (``--tests``: the same tests in every tree)."""
    report = workdir / "lab-report.json"
    trips = workdir / "round-trips.json"
    argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "roundtrips", "-p", "delay", "--pyargs",
            *targets, "--san-backend=hil", f"--san-inventory={inventory}", f"--san-report={report}",
            *(["-p", "unbatched"] if off else []), *extra]
    env = _plugin_env(trips, delay_ms, off)
    label = f"{label}, {delay_ms:g} ms a round trip" if delay_ms else label
    print(f"suite ({label}): {' '.join(argv[1:])}", flush=True)
    began = time.perf_counter()
    try:
        result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, env=env, timeout=timeout,
                                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Suite(time.perf_counter() - began, -1, f"did not finish within {timeout:g} s")
    took = time.perf_counter() - began
    lines = [ln for ln in result.stdout.strip().splitlines() if ln.strip()]
    summary = lines[-1].strip("= ") if lines else "(no output)"
    failed: list[str] = []
    if report.exists():
        rules = json.loads(report.read_text()).get("rules", {})
        failed = [r for r, counts in rules.items() if counts.get("failed")]
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-4000:] + result.stderr[-2000:])
    rounds = summarize_round_trips(json.loads(trips.read_text())) if trips.exists() else None
    outcomes = _outcomes(report)
    return Suite(took, result.returncode, summary, failed, rounds, outcomes)


def tests_of(path: Path) -> list[str]:
    """``--tests``' lines as ``--pyargs`` targets: ``test_x.py::test_y[id]`` -> ``pytest_san.scenarios.test_x::...``."""
    targets = []
    for line in path.read_text().splitlines():
        name, sep, rest = line.strip().partition("::")
        if not name.endswith(".py") or not sep:
            raise SystemExit(f"{path}: {line!r} is not test_module.py::test_name[id]")
        targets.append(f"pytest_san.scenarios.{name[:-3].replace('/', '.')}::{rest}")
    return targets


def _outcomes(report: Path) -> dict[str, str]:
    """Each test's outcome by its name inside the package (the trees' install paths differ)."""
    if not report.exists():
        return {}
    tests = json.loads(report.read_text()).get("tests", [])
    return {t["nodeid"].split("scenarios/", 1)[-1]: t["outcome"] for t in tests if "nodeid" in t}


def summarize_round_trips(data: dict[str, Any]) -> dict[str, Any]:
    """Per host: mean agent round trips per test in setup, call and teardown; and what the SAN fixtures
    cost (setup + teardown: closing the switch's connections, the leak check, the reset), mean and max."""
    tests: dict[str, dict[str, Any]] = data["tests"]
    hosts: list[str] = data["hosts"]
    count = max(1, len(tests))
    out: dict[str, Any] = {"tests": len(tests), "per_test": {}, "fixtures": {},
                           "all_hosts": {phase: sum(sum(t.get(phase, {}).values()) for t in tests.values()) / count
                                         for phase in ("setup", "call", "teardown")}}
    for host in hosts:
        out["per_test"][host] = {phase: sum(t.get(phase, {}).get(host, 0) for t in tests.values()) / count
                                 for phase in ("setup", "call", "teardown")}
        spent = [t["fixtures"]["setup"].get(host, 0) + t["fixtures"]["teardown"].get(host, 0)
                 for t in tests.values() if "fixtures" in t]
        if spent:
            out["fixtures"][host] = {"mean": sum(spent) / len(spent), "max": max(spent), "tests": len(spent)}
    return out


def describe_round_trips(rounds: dict[str, Any] | None, seconds: float | None = None) -> list[str]:
    if not rounds:
        return ["    (no round trips recorded)"]
    every = rounds.get("all_hosts", {})
    per_test = f", {seconds / max(1, rounds['tests']):.2f} s a test" if seconds is not None else ""
    lines = [f"    all hosts: agent round trips per test {sum(every.values()):.1f} (setup {every.get('setup', 0):.1f}, "
             f"call {every.get('call', 0):.1f}, teardown {every.get('teardown', 0):.1f}), {rounds['tests']} tests"
             f"{per_test}"]
    for host, phases in rounds["per_test"].items():
        fixtures = rounds["fixtures"].get(host)
        fx = (f"; SAN fixtures {fixtures['mean']:.2f} (max {fixtures['max']})" if fixtures
              else "; SAN fixtures not recorded by this tree")
        lines.append(f"    {host}: agent round trips per test: setup {phases['setup']:.1f}, call "
                     f"{phases['call']:.1f}, teardown {phases['teardown']:.1f}{fx}")
    return lines


@dataclass
class Baseline:
    rev: str
    tree: Path
    python: str


def make_baseline(rev: str, workdir: Path) -> Baseline:
    """``rev`` checked out in a worktree under ``workdir``, installed in a venv of its own: this checkout's
    editable install maps ``pytest_san`` and ``hil`` to this tree, whatever PYTHONPATH says."""
    tree = workdir / f"baseline-{rev}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True,
                   stdout=subprocess.DEVNULL)
    venv = workdir / f"venv-{rev}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", f"{tree}[hil,test]"], check=True)
    where = subprocess.run([python, "-c", "import pytest_san, hil; print(pytest_san.__file__, hil.__file__)"],
                           cwd=workdir, capture_output=True, text=True, check=True).stdout.split()
    if any(Path(w).resolve().is_relative_to(ROOT) for w in where):
        raise SystemExit(f"baseline {rev}: its venv imports this checkout ({where})")
    return Baseline(rev, tree, python)


def drop_baseline(baseline: Baseline) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline.tree)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def side_by_side(inventory: Path, workdir: Path, timeout: float, baseline: Baseline, rounds: int,
                 delay_ms: float = 0.0, extra: Sequence[str] = (), goal: float = 0.5,
                 targets: Sequence[str] = SUITE) -> dict[str, Any]:
    """The suite of this tree and of the baseline, alternating ``rounds`` times each against the same lab:
    medians, this tree's median over the baseline's (``goal``: at most that), and the tests whose outcome
    differs between the trees."""
    runs: dict[str, list[Suite]] = {"this tree": [], baseline.rev: []}
    for i in range(rounds):
        order = [("this tree", sys.executable), (baseline.rev, baseline.python)]
        for label, python in (order if i % 2 == 0 else order[::-1]):
            run_dir = workdir / f"run-{label.replace(' ', '-')}-{i}-{delay_ms:g}"
            run_dir.mkdir()
            suite = run_suite(inventory, run_dir, timeout, python, label, delay_ms, extra, targets=targets)
            print(f"  {label} round {i + 1}: {suite.seconds:.1f} s, exit {suite.returncode}: {suite.summary}",
                  flush=True)
            runs[label].append(suite)
    new = statistics.median(s.seconds for s in runs["this tree"])
    old = statistics.median(s.seconds for s in runs[baseline.rev])
    ours, theirs = runs["this tree"][-1].outcomes, runs[baseline.rev][-1].outcomes
    differ = sorted(t for t in ours.keys() | theirs.keys() if ours.get(t) != theirs.get(t))
    return {"baseline": baseline.rev, "runs": {k: [asdict(s) for s in v] for k, v in runs.items()},
            "median_s": {"this tree": new, baseline.rev: old}, "ratio": new / old, "goal": goal,
            "verdict": "PASS" if new / old <= goal else "MISS", "delay_ms": delay_ms,
            "outcomes_differ": {t: [ours.get(t, "-"), theirs.get(t, "-")] for t in differ}}


# --- g. what each use of calls made together saves ------------------------------------------------------


def per_use(inventory: Path, workdir: Path, timeout: float, delays: Sequence[float], extra: Sequence[str] = (),
            model_sequences: int = 0) -> list[dict[str, Any]]:
    """This tree's suite at each delay with every use of calls made together, then with each use made one call
    at a time (benchmarks/unbatched.py): per use and delay, the seconds and round trips per test it saves. The
    model's use is measured on the model run alone (``model_sequences``, as ``run_model``): in the suite its
    items stop at a deadline, so they take the same time either way."""
    rows: list[dict[str, Any]] = []
    for delay_ms in delays:
        runs: dict[str, Suite] = {}
        for off in ("", *(u for u in unbatched.USES if u != "model")):
            run_dir = workdir / f"use-{off or 'all'}-{delay_ms:g}"
            run_dir.mkdir()
            label = f"this tree, {off} one call at a time" if off else "this tree"
            runs[off] = suite = run_suite(inventory, run_dir, timeout, label=label, delay_ms=delay_ms, extra=extra,
                                          off=[off] if off else [])
            print(f"  {label}: {suite.seconds:.1f} s, exit {suite.returncode}: {suite.summary}", flush=True)
        every = runs[""]
        if model_sequences:
            made = [run_model(inventory, workdir, model_sequences, timeout, delay_ms=delay_ms, off=off)
                    for off in ([], ["model"])]
            rows.append({"use": "model", "delay_ms": delay_ms, "seconds": made[1]["seconds"],
                         "with_it": made[0]["seconds"], "saves_s": made[1]["seconds"] - made[0]["seconds"],
                         "round_trips": made[1]["round_trips"] / model_sequences,
                         "round_trips_with_it": made[0]["round_trips"] / model_sequences,
                         "outcomes_same": made[0]["divergences"] == made[1]["divergences"] == 0,
                         "tests": model_sequences})
        for use in runs.keys() - {""}:
            alone = runs[use]
            rows.append({"use": use, "delay_ms": delay_ms, "seconds": alone.seconds, "with_it": every.seconds,
                         "saves_s": alone.seconds - every.seconds,
                         "round_trips": _per_test(alone), "round_trips_with_it": _per_test(every),
                         "outcomes_same": alone.outcomes == every.outcomes, "tests": len(every.outcomes)})
    return rows


def _per_test(suite: Suite) -> float:
    every = (suite.round_trips or {}).get("all_hosts", {})
    return float(sum(every.values()))


def describe_per_use(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["  each use of calls made together, made one call at a time instead (this tree's suite with it"
             " / without it):",
             f"    {'use':10s} {'delay':>6s} {'with':>8s} {'without':>8s} {'saves':>8s}   round trips a test"
             "   outcomes"]
    for row in rows:
        lines.append(f"    {row['use']:10s} {row['delay_ms']:4g}ms {row['with_it']:7.1f}s {row['seconds']:7.1f}s "
                     f"{row['saves_s']:+7.1f}s   {row['round_trips_with_it']:5.1f} / {row['round_trips']:5.1f}"
                     f"        {'same' if row['outcomes_same'] else 'DIFFER'} ({row['tests']} tests)")
    return lines


# --- e. the reference model ---------------------------------------------------------------------------------


def run_model(inventory: Path, workdir: Path, sequences: int, timeout: float, python: str = sys.executable,
              label: str = "this tree", delay_ms: float = 0.0, off: Sequence[str] = ()) -> dict[str, Any]:
    """``pytest --pyargs pytest_san.model`` on the lab with ``python`` (this tree's or a baseline's), ``sequences``
    x 20 steps at seed 1, differential (as CI runs it), the regressions it replays first included: its cost line,
    seconds, divergences and round trips (benchmarks/roundtrips.py)."""
    run_dir = workdir / f"model-{label.replace(' ', '-')}-{delay_ms:g}-{time.monotonic_ns()}"
    run_dir.mkdir()
    report, trips, replayed = run_dir / "report.json", run_dir / "round-trips.json", run_dir / "replaying.json"
    argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "roundtrips", "-p", "delay", "-p",
            "replaying", "--pyargs", "pytest_san.model", "--san-backend=hil", f"--san-inventory={inventory}",
            f"--san-report={report}",
            f"--san-model-sequences={sequences}", "--san-model-steps=20", "--san-model-seed=1",
            "--san-model-differential", *(["-p", "unbatched"] if off else [])]
    env = {**_plugin_env(trips, delay_ms, off), replaying.ENV: str(replayed)}
    label = f"{label}, {', '.join(off)} one call at a time" if off else label
    began = time.perf_counter()
    result = subprocess.run(argv, cwd=run_dir, capture_output=True, text=True, env=env, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    took = time.perf_counter() - began
    model = json.loads(report.read_text()).get("model", {}) if report.exists() else {}
    spent = 0
    if trips.exists():
        for test in json.loads(trips.read_text())["tests"].values():
            spent += sum(sum(test.get(phase, {}).values()) for phase in ("setup", "call", "teardown"))
    out = {"label": label, "delay_ms": delay_ms, "seconds": took, "returncode": result.returncode,
           "model_seconds": model.get("seconds", 0.0), "sequences": model.get("sequences", 0),
           "replaying": json.loads(replayed.read_text())["seconds"] if replayed.exists() else 0.0,
           "steps": model.get("steps", 0),
           "divergences": len(model.get("divergences", [])), "costs": model.get("costs", []), "round_trips": spent}
    print(f"  model ({label}, {delay_ms:g} ms a round trip): {took:.1f} s, exit {result.returncode}, "
          f"{out['divergences']} divergences; {'; '.join(out['costs'])}", flush=True)
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-3000:] + result.stderr[-2000:])
    return out


def describe_model(runs: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["  the model, 20-step sequences at seed 1, differential, its regressions first (as CI runs it):"]
    for run in runs:
        # Per sequence: the model's own time without the regressions' replay (once a run, timed alike in every
        # tree by benchmarks/replaying.py), and with it spread over the sequences, as cost lines used to count.
        model_seconds, replayed = run.get("model_seconds", run["seconds"]), run.get("replaying", 0.0)
        count = max(1, run["sequences"])
        lines.append(f"    {run['label']:22s} {run['delay_ms']:4g} ms a round trip: {run['seconds']:7.1f} s in all, "
                     f"{(model_seconds - replayed) / count:5.2f} s a sequence ({model_seconds / count:5.2f} with "
                     f"the {replayed:.1f} s replaying the regressions), {run['round_trips']} round trips, "
                     f"{run['divergences']} divergences")
        lines += [f"      {cost}" for cost in run["costs"]]
    return lines


# --- c. bandwidth: the harness and ib_write_bw -----------------------------------------------------------


def measure_ib_write_bw(client: Agent, server: Agent) -> tuple[float, str]:
    """(Gb/s, the client's command line) of ib_write_bw at SIZE from ``client`` to ``server``."""
    run = ("-s", str(SIZE), "-n", str(ITERATIONS))
    rows = [gbps for size, gbps in bandwidth.measure_ib_write_bw(client, server, run, timeout=300.0)
            if size == SIZE]
    if not rows:
        raise BandwidthError(f"{client.host.name}: no {SIZE}-byte row in ib_write_bw's output")
    return rows[0], " ".join(["ib_write_bw", *bandwidth.perftest_args(client, run), address_of(server)])


# --- d. where the harness's time goes --------------------------------------------------------------------


def per_call_ms(call: Callable[[], object], seconds: float, least: int = 5) -> float:
    count, began = 0, time.perf_counter()
    while count < least or time.perf_counter() - began < seconds:
        call()
        count += 1
    return (time.perf_counter() - began) / count * 1e3


def cpu_jiffies(agent: Agent) -> tuple[int, int]:
    """(busy, total) jiffies of the host's CPUs so far, from /proc/stat."""
    fields = [int(v) for v in agent.transport.run(["head", "-1", "/proc/stat"], timeout=30).stdout.split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class Busy:
    """How busy each host's CPU was between ``start()`` and ``stop()``, as a fraction."""

    def __init__(self, agents: Sequence[Agent]) -> None:
        self.agents = agents
        self.before: list[tuple[int, int]] = []

    def start(self) -> None:
        self.before = [cpu_jiffies(a) for a in self.agents]

    def stop(self) -> dict[str, float]:
        after = [cpu_jiffies(a) for a in self.agents]
        return {a.host.name: (b1 - b0) / max(1, t1 - t0)
                for a, (b0, t0), (b1, t1) in zip(self.agents, self.before, after, strict=True)}


def profile(backend: HilBackend, seconds: float) -> dict[str, Any]:
    busy = Busy(backend.agents[:2])
    conn = Switch(backend).connect()
    a, b = conn.local, conn.remote
    out: dict[str, Any] = {}
    try:
        out["agent_rtt_ms"] = per_call_ms(lambda: a.process.alive, seconds / 4)  # controller <-> agent
        out["child_rtt_ms"] = per_call_ms(lambda: a.socket.connected, seconds / 4)  # ... <-> verbs child
        src, dst = a.process.alloc(LARGE), b.process.alloc(LARGE)
        src.write(bytes(range(256)) * (SIZE // 256))
        handle = a.provider.register_memory(a.socket, src, Access.READ)
        desc = b.provider.register_rdma_memory(b.socket, dst, Access.WRITE)
        small = src.view(0, SIZE)

        def post() -> Any:
            return a.provider.rdma_write(a.socket, [(small, handle)], desc)

        def settle(op: Any) -> None:
            done = op.wait(timeout=60)
            if done.status is not Status.SUCCESS:
                raise BandwidthError(f"profile: a {SIZE}-byte write completed {done.status.name}")

        settle(post())  # warm-up
        posts: list[float] = []
        waits: list[float] = []
        busy.start()
        began = time.perf_counter()
        while len(posts) < 5 or time.perf_counter() - began < seconds / 2:
            t0 = time.perf_counter()
            op = post()
            t1 = time.perf_counter()
            settle(op)
            posts.append(t1 - t0)
            waits.append(time.perf_counter() - t1)
        out["sequential"] = {"writes": len(posts), "post_ms": statistics.median(posts) * 1e3,
                             "wait_ms": statistics.median(waits) * 1e3,
                             "gbps": gbps(SIZE * len(posts), time.perf_counter() - began), "cpu": busy.stop()}
        out["bursts"] = {}
        out["bursts_cpu"] = {}
        for depth in DEPTHS:
            busy.start()
            out["bursts"][depth] = timed_burst(a, [(small, handle)], desc, SIZE, seconds / 2, depth)
            out["bursts_cpu"][depth] = busy.stop()
        busy.start()
        began = time.perf_counter()
        done = a.provider.rdma_write(a.socket, [(src, handle)], desc).wait(timeout=120)
        took = time.perf_counter() - began
        if done.status is not Status.SUCCESS:
            raise BandwidthError(f"profile: the {LARGE}-byte write completed {done.status.name}")
        out["large"] = {"bytes": LARGE, "seconds": took, "gbps": gbps(LARGE, took), "cpu": busy.stop()}
    finally:
        conn.close()
    return out


def spi_round_trips(backend: HilBackend) -> dict[str, dict[str, int]]:
    """Agent round trips (per host) of single SPI calls and of the harness's steps, counted by the client."""
    out: dict[str, dict[str, int]] = {}

    def count(name: str, step: Callable[[], Any]) -> Any:
        before = backend.round_trips()
        value = step()
        after = backend.round_trips()
        out[name] = {h: after[h] - before.get(h, 0) for h in after}
        return value

    switch = Switch(backend)
    conn = count("switch.connect() (two hosts)", switch.connect)
    a, b = conn.local, conn.remote
    src = count("process.alloc", lambda: a.process.alloc(SIZE))
    dst = b.process.alloc(SIZE)
    handle = count("register_memory", lambda: a.provider.register_memory(a.socket, src, Access.READ))
    desc = count("register_rdma_memory", lambda: b.provider.register_rdma_memory(b.socket, dst, Access.WRITE))
    op = count("rdma_write (post)", lambda: a.provider.rdma_write(a.socket, [(src, handle)], desc))
    count("operation.wait", lambda: op.wait(60))
    count("deregister_memory", lambda: a.provider.deregister_memory(a.socket, handle))
    count("conn.local.send + conn.remote.recv (5 bytes)", lambda: (a.send(b"hello"), b.recv(5)))
    count("end of test with the connection open (close, leaks, reset)",
          lambda: backend.end_test(switch.close_all))
    count("end of test without connections (leaks, reset)", backend.end_test)
    return out


# --- the run ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/lab.py", description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, default=None,
                        help="a running lab's inventory (default: $SAN_LAB_INVENTORY)")
    parser.add_argument("--boot", action="store_true", help="boot a lab of its own with san-hil lab up (and down)")
    parser.add_argument("--hosts", type=int, default=2, help="with --boot: guests to boot")
    parser.add_argument("--state-dir", type=Path, default=None, help="with --boot: the lab's state directory")
    parser.add_argument("--up-args", nargs=argparse.REMAINDER, default=[], help="with --boot: more lab up options")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the harness measures (default 10)")
    parser.add_argument("--suite-timeout", type=float, default=3600.0)
    parser.add_argument("--no-suite", action="store_true",
                        help="skip the suite's wall time (with --baseline: only the model runs side by side)")
    parser.add_argument("--no-profile", action="store_true", help="skip the breakdown of the harness's time")
    parser.add_argument("--no-bandwidth", action="store_true",
                        help="skip the bandwidth comparison and the profile (round trips per SPI call are kept)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run REV's suite (its own worktree and venv) side by side, alternating")
    parser.add_argument("--rounds", type=int, default=2, help="with --baseline: runs of each tree (default 2)")
    parser.add_argument("--model-sequences", type=int, default=10, metavar="N",
                        help="the model's sequences of 20 steps (default 10; 0 skips it)")
    parser.add_argument("--delay-ms", type=float, default=0.0, metavar="MS",
                        help="benchmark only: also run the suites and the model with MS added to every round trip")
    parser.add_argument("--suite-args", default="", metavar="ARGS",
                        help="more pytest arguments for every suite run, e.g. '--san-sample 2' (both trees)")
    parser.add_argument("--suite-goal", type=float, default=0.5, metavar="RATIO",
                        help="with --baseline: this tree's suite time over the baseline's must be at most this")
    parser.add_argument("--per-use", action="store_true",
                        help="what each use of calls made together saves: the suite without each (at 0 ms and "
                             "--delay-ms)")
    parser.add_argument("--tests", type=Path, default=None, metavar="FILE",
                        help="with --baseline: run exactly these tests in both trees (one per line, as the report "
                             "names them inside pytest_san/scenarios: test_x.py::test_y[id]); a sample drawn in "
                             "each tree differs once either adds a scenario")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--check", action="store_true", help="exit 1 when the ratio misses the goal")
    args = parser.parse_args(argv)

    # A SIGTERM (a CI timeout, a kill) still runs the cleanup below: the baseline's worktree, a booted lab.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = Path(tempfile.mkdtemp(prefix="san-lab-bench-"))
    booted: Path | None = None
    baseline: Baseline | None = None
    try:
        if args.boot:
            booted = args.state_dir or workdir / "lab"
            inventory = booted / "lab.yaml"
            boot = boot_lab(args.hosts, booted, inventory, args.up_args)
        else:
            value = args.inventory or os.environ.get("SAN_LAB_INVENTORY")
            if not value:
                parser.error("give --inventory PATH of a running lab (or --boot to boot one)")
            inventory = Path(value)
        hosts = load_inventory(inventory).select("san")[:2]
        if len(hosts) < 2 or any(h.engine != "verbs" for h in hosts):
            raise SystemExit(f"{inventory}: needs two verbs hosts in group san, got {[h.name for h in hosts]}")
        if not args.boot:
            boot = recorded_boot(hosts, inventory)
        print(f"boot: {boot.how}: " + ("-" if boot.seconds is None else f"{boot.seconds:.1f} s"), flush=True)

        compared = delayed = None
        suite: Suite | None
        delayed_suite: Suite | None = None
        extra = shlex.split(args.suite_args)
        targets = tests_of(args.tests) if args.tests else SUITE
        where = inventory.resolve()
        baseline = make_baseline(args.baseline, workdir) if args.baseline else None
        if baseline is not None and not args.no_suite:
            compared = side_by_side(where, workdir, args.suite_timeout, baseline, args.rounds, 0.0, extra,
                                    args.suite_goal, targets)
            if args.delay_ms:
                delayed = side_by_side(where, workdir, args.suite_timeout, baseline, args.rounds, args.delay_ms,
                                       extra, args.suite_goal, targets)
            suite = Suite(**compared["runs"]["this tree"][-1])
        elif baseline is not None:
            suite = None
        else:
            suite = None if args.no_suite else run_suite(where, workdir, args.suite_timeout, extra=extra)
            if suite is not None and args.delay_ms:
                run_dir = workdir / "delayed"
                run_dir.mkdir()
                delayed_suite = run_suite(where, run_dir, args.suite_timeout, delay_ms=args.delay_ms, extra=extra)
        uses = (per_use(where, workdir, args.suite_timeout, sorted({0.0, args.delay_ms}), extra, args.model_sequences)
                if args.per_use else [])
        if suite is not None:
            print(f"suite: {suite.seconds:.1f} s, exit {suite.returncode}: {suite.summary}", flush=True)
        models = []
        if args.model_sequences > 0:
            trees = [("this tree", sys.executable)] + ([(baseline.rev, baseline.python)] if baseline else [])
            for turn in range(args.rounds if baseline else 1):  # alternating: a drift in load hits both trees
                for delay_ms in (0.0, args.delay_ms) if args.delay_ms else (0.0,):
                    for label, python in trees if turn % 2 == 0 else trees[::-1]:
                        models.append(run_model(inventory.resolve(), workdir, args.model_sequences,
                                                args.suite_timeout, python, label, delay_ms))

        result: dict[str, Any] = {"inventory": str(inventory), "hosts": [h.name for h in hosts],
                                  "boot": asdict(boot), "suite": asdict(suite) if suite else None,
                                  "delayed_suite": asdict(delayed_suite) if delayed_suite else None,
                                  "side_by_side": compared, "side_by_side_delayed": delayed, "model": models,
                                  "per_use": uses}
        backend = HilBackend(hosts)
        harness = perftest = float("nan")
        command = ""
        breakdown = None
        try:
            client, server = backend.agents[0], backend.agents[1]
            calls = spi_round_trips(backend)
            if not args.no_bandwidth:
                print(f"harness: bursts of {SIZE}-byte rdma_writes for about {args.seconds:g} s", flush=True)
                harness = measure_harness(backend, sizes=(SIZE,), seconds=args.seconds)[0][1]
                print("ib_write_bw ...", flush=True)
                perftest, command = measure_ib_write_bw(client, server)
                breakdown = None if args.no_profile else profile(backend, args.seconds)
        finally:
            backend.close()
    finally:
        if baseline is not None:
            drop_baseline(baseline)
        if booted is not None:
            subprocess.run(["san-hil", "lab", "down", "--state-dir", str(booted)], stdin=subprocess.DEVNULL)
        shutil.rmtree(workdir, ignore_errors=True)  # the suite's report (read above) and, with --boot, the lab's

    ratio = harness / perftest
    verdict = "-" if args.no_bandwidth else "PASS" if ratio >= GOAL else "MISS"
    result.update({"harness_gbps": harness, "ib_write_bw_gbps": perftest, "ib_write_bw_command": command,
                   "ratio": ratio, "goal": GOAL, "verdict": verdict, "profile": breakdown,
                   "spi_round_trips": calls})
    names = " <-> ".join(h.name for h in hosts)
    print()
    print(f"lab {inventory} ({names})")
    print(f"  boot time            {'-' if boot.seconds is None else f'{boot.seconds:8.1f} s'}   {boot.how}")
    if suite is not None:
        rules = f"; rules failing: {', '.join(suite.failed_rules)}" if suite.failed_rules else ""
        print(f"  suite on the lab     {suite.seconds:8.1f} s   exit {suite.returncode}: {suite.summary}{rules}")
        print("\n".join(describe_round_trips(suite.round_trips, suite.seconds)))
    if delayed_suite is not None:
        print(f"  ... {args.delay_ms:g} ms added to every round trip: {delayed_suite.seconds:8.1f} s   "
              f"exit {delayed_suite.returncode}: {delayed_suite.summary}")
        print("\n".join(describe_round_trips(delayed_suite.round_trips, delayed_suite.seconds)))
    for pair in (compared, delayed):
        if pair is None:
            continue
        added = f", {pair['delay_ms']:g} ms added to every round trip" if pair["delay_ms"] else ""
        print(f"  side by side with {pair['baseline']} (alternating, same lab{added}):")
        for label, runs in pair["runs"].items():
            times = ", ".join(f"{r['seconds']:.1f} s" for r in runs)
            print(f"    {label:12s} median {pair['median_s'][label]:7.1f} s   runs: {times}   "
                  f"({runs[-1]['summary']})")
            print("\n".join(describe_round_trips(runs[-1]["round_trips"], pair["median_s"][label])))
        print(f"    this tree / {pair['baseline']} = {pair['ratio']:.2f}   goal <= {pair['goal']:g}   "
              f"{pair['verdict']}")
        differ = pair["outcomes_differ"]
        print(f"    outcomes: {'the same, test by test' if not differ else f'{len(differ)} tests differ'}")
        for test, (new, old) in list(differ.items())[:20]:
            print(f"      {test}: this tree {new}, {pair['baseline']} {old}")
    if uses:
        print("\n".join(describe_per_use(uses)))
    if models:
        print("\n".join(describe_model(models)))
    print("  agent round trips of single calls (per host):")
    for name, per_host in calls.items():
        print(f"    {name:60s} " + ", ".join(f"{h} {n}" for h, n in per_host.items()))
    if args.no_bandwidth:
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    print(f"  RDMA write {SIZE // 1024} KiB   harness {harness:.4f} Gb/s ({mibps(harness):.2f} MiB/s)   "
          f"ib_write_bw {perftest:.4f} Gb/s ({mibps(perftest):.2f} MiB/s)")
    print(f"  ratio harness/ib_write_bw {ratio:.2f}   goal >= {GOAL}   {verdict}")
    print(f"    ({command}; server on {server.host.name} without an address)")
    if breakdown is not None:
        seq = breakdown["sequential"]

        def cpu(fractions: dict[str, float]) -> str:
            return "guest CPU busy " + ", ".join(f"{name} {share:.0%}" for name, share in fractions.items())

        print("  where the harness's time goes (64 KiB writes):")
        print(f"    agent round trip (process.alive)          {breakdown['agent_rtt_ms']:7.1f} ms")
        print(f"    agent + verbs child (socket.connected)    {breakdown['child_rtt_ms']:7.1f} ms")
        print(f"    rdma_write post / wait, one at a time      {seq['post_ms']:7.1f} / {seq['wait_ms']:.1f} ms"
              f"  -> {seq['gbps']:.4f} Gb/s; {cpu(seq['cpu'])}")
        for depth, rate in breakdown["bursts"].items():
            print(f"    burst, {depth:2d} in flight                        {rate:.4f} Gb/s "
                  f"(ratio {rate / perftest:.2f}); {cpu(breakdown['bursts_cpu'][depth])}")
        large = breakdown["large"]
        print(f"    one {large['bytes'] >> 20} MiB write                          {large['gbps']:.4f} Gb/s "
              f"({large['seconds']:.2f} s); {cpu(large['cpu'])}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if args.check and verdict == "MISS" else 0


if __name__ == "__main__":
    sys.exit(main())
