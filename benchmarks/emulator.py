"""How fast the emulator is, side by side with the plain-Python baselines it is judged against.

Run ``python benchmarks/emulator.py`` (add ``--check`` to exit non-zero when a goal is missed):

a. one register_memory + deregister_memory pair of a 4 KiB buffer on a connected emulated
   socket, against a bare dict insert + delete (goal: at most 10x);
b. a waited 1 MiB rdma_write (registered READ source, WRITE descriptor target) against a plain
   ``dst[:] = memoryview(src)`` copy of 1 MiB (goal: at least 0.5x the plain throughput);
c. a 64-byte rdma_write round trip, post + wait (reported, no goal);
d. the wall time of the conformance suite on the emulator, run in a subprocess (goal: < 5 s).

Every timing is timeit's best of several repeats, each long enough (autorange) to be stable.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_san import Access
from pytest_san.emulator import EmulatorBackend

KIB = 1024
MIB = 1024 * KIB
GB = 1e9
ROOT = Path(__file__).resolve().parent.parent
SUITE = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "pytest_san.scenarios"]


@dataclasses.dataclass
class Row:
    name: str
    value: str
    goal: str
    verdict: str  # PASS, MISS, INFO or SKIP
    note: str = ""


def best_time(stmt: str | Callable[[], Any], repeat: int, min_time: float,
              namespace: dict[str, Any] | None = None) -> float:
    """Seconds per execution of ``stmt``: timeit's best of ``repeat`` runs of at least ``min_time`` each.

    A string statement is compiled into timeit's loop, so no Python call wraps it: the dict
    baseline is really a bare insert + delete.
    """
    timer = timeit.Timer(stmt, globals=namespace)
    number = 1
    while True:  # like Timer.autorange, with our own target duration
        if timer.timeit(number) >= min_time:
            break
        number *= 2 if number < 10 else 5
    return min(timer.repeat(repeat=repeat, number=number)) / number


def bench_register(repeat: int, min_time: float) -> tuple[float, float]:
    """(ns per register+deregister pair, ns per dict insert+delete)."""
    backend = EmulatorBackend()
    a, b = backend.nodes[0].default_process, backend.nodes[1].default_process
    sa, _ = backend.connect_sockets(a, b)
    provider = a.node.provider
    buf = a.alloc(4 * KIB)
    namespace: dict[str, Any] = {
        "register": provider.register_memory, "deregister": provider.deregister_memory,
        "sock": sa, "buf": buf, "READ": Access.READ,
        "table": {}, "key": 0x1000001, "value": object(),
    }
    # Both statements run in the same timeit loop with bound names: only the work differs.
    emu = best_time("deregister(sock, register(sock, buf, READ))", repeat, min_time, namespace)
    plain = best_time("table[key] = value; del table[key]", repeat, min_time, namespace)
    leaks = backend.leaks()
    assert provider.registrations(sa) == [] and not [x for x in leaks if x.kind == "registration"], leaks
    backend.close()
    return emu * 1e9, plain * 1e9


def bench_rdma(repeat: int, min_time: float) -> tuple[float, float, float]:
    """(emulator GB/s for 1 MiB rdma_write, plain memoryview copy GB/s, µs per 64-byte round trip)."""
    backend = EmulatorBackend()
    a, b = backend.nodes[0].default_process, backend.nodes[1].default_process
    sa, sb = backend.connect_sockets(a, b)
    pa, pb = a.node.provider, b.node.provider
    src, dst = a.alloc(MIB), b.alloc(MIB)
    src.write(bytes(range(256)) * (MIB // 256))
    handle = pa.register_memory(sa, src, Access.READ)
    desc = pb.register_rdma_memory(sb, dst, Access.WRITE)
    done = pa.rdma_write(sa, [(src, handle)], desc, 0).wait()
    assert done.ok and done.bytes == MIB and dst.read() == src.read(), done
    namespace: dict[str, Any] = {
        "write": pa.rdma_write, "sock": sa, "desc": desc,
        "whole": [(src, handle)], "small": [(src.view(0, 64), handle)],
        "src": bytearray(src.read()), "dst": bytearray(MIB),
    }
    emu = best_time("write(sock, whole, desc, 0).wait()", repeat, min_time, namespace)
    plain = best_time("dst[:] = memoryview(src)", repeat, min_time, namespace)
    round_trip = best_time("write(sock, small, desc, 0).wait()", repeat, min_time, namespace)
    pa.deregister_memory(sa, handle)
    pb.deregister_rdma_memory(sb, desc)
    backend.close()
    return MIB / emu / GB, MIB / plain / GB, round_trip * 1e6


def suite_missing() -> str | None:
    """Why the conformance suite cannot run here (scenarios or the pytest11 plugin missing), or None."""
    try:
        if importlib.util.find_spec("pytest_san.scenarios") is None:
            return "pytest_san.scenarios is not there yet"
    except ImportError as exc:
        return f"pytest_san.scenarios cannot be imported: {exc}"
    if not any(ep.name == "san" for ep in importlib.metadata.entry_points(group="pytest11")):
        return "the pytest-san plugin is not installed (pip install -e .)"
    return None


def bench_suite(timeout: float) -> tuple[float | None, str]:
    """(wall seconds of the conformance suite, or None if it could not run; a note)."""
    missing = suite_missing()
    if missing:
        return None, missing
    start = time.perf_counter()
    try:
        proc = subprocess.run(SUITE, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, f"timed out after {timeout:.0f} s"
    wall = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    tail = next((line for line in reversed(output.splitlines()) if line.strip()), "")
    if proc.returncode == 0:
        return wall, tail.strip("= ")
    if proc.returncode in (4, 5) or "ModuleNotFoundError" in output or re.search(r"fixture '\w+' not found", output):
        # 4: usage error (package or plugin missing), 5: nothing collected.
        return None, f"could not run (exit {proc.returncode}): {tail.strip('= ')[:100]}"
    return wall, f"suite FAILED (exit {proc.returncode}): {tail.strip('= ')[:100]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if any goal is missed")
    parser.add_argument("--repeat", type=int, default=7, help="timeit repeats; the best one counts (default 7)")
    parser.add_argument("--min-time", type=float, default=0.05,
                        help="seconds each repeat runs at least (default 0.05)")
    parser.add_argument("--no-suite", action="store_true", help="skip the conformance suite run")
    parser.add_argument("--suite-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)

    rows: list[Row] = []
    reg_ns, dict_ns = bench_register(args.repeat, args.min_time)
    ratio = reg_ns / dict_ns
    rows.append(Row("register+deregister 4 KiB", f"{reg_ns:,.0f} ns", "", "INFO"))
    rows.append(Row("dict insert+delete", f"{dict_ns:,.0f} ns", "", "INFO"))
    rows.append(Row("  ratio register/dict", f"{ratio:.1f}x", "<= 10x", "PASS" if ratio <= 10 else "MISS"))

    emu_gbps, plain_gbps, rt_us = bench_rdma(args.repeat, args.min_time)
    share = emu_gbps / plain_gbps
    rows.append(Row("rdma_write 1 MiB (waited)", f"{emu_gbps:.2f} GB/s", "", "INFO"))
    rows.append(Row("memoryview copy 1 MiB", f"{plain_gbps:.2f} GB/s", "", "INFO"))
    rows.append(Row("  ratio emulator/plain", f"{share:.2f}x", ">= 0.5x", "PASS" if share >= 0.5 else "MISS"))
    rows.append(Row("rdma_write 64 B round trip", f"{rt_us:.2f} µs", "-", "INFO"))

    if args.no_suite:
        rows.append(Row("conformance suite (emulator)", "-", "< 5 s", "SKIP", "--no-suite"))
    else:
        wall, note = bench_suite(args.suite_timeout)
        if wall is None:
            rows.append(Row("conformance suite (emulator)", "-", "< 5 s", "SKIP", note))
        else:
            ok = wall < 5.0 and "FAILED" not in note and "timed out" not in note
            rows.append(Row("conformance suite (emulator)", f"{wall:.2f} s", "< 5 s", "PASS" if ok else "MISS", note))

    print(f"pytest-san emulator benchmark (python {sys.version.split()[0]}, best of {args.repeat})")
    widths = [max(len(r.name) for r in rows), max(len(r.value) for r in rows), max(len(r.goal) for r in rows)]
    header = f"{'measurement':<{widths[0]}}  {'value':>{widths[1]}}  {'goal':<{widths[2]}}  result"
    print(header)
    print("-" * len(header))
    for r in rows:
        line = f"{r.name:<{widths[0]}}  {r.value:>{widths[1]}}  {r.goal:<{widths[2]}}  {r.verdict}"
        print(line + (f"  ({r.note})" if r.note else ""))
    missed = [r.name.strip() for r in rows if r.verdict == "MISS"]
    if missed:
        print(f"\nmissed: {', '.join(missed)}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
