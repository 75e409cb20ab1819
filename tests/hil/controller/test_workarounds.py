"""The verbs engine's workarounds in the verdict (hil/controller/workarounds.py): from each agent's hello to the
report's "deviations", one entry a workaround with the hosts that apply it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hil.agent.engines.verbs import quirks
from hil.controller.kernel import KernelLog
from hil.controller.workarounds import applied_on, every_workaround, kernels, workaround
from hil.lab.reproduce import REPRODUCERS

LOCAL = "local://?engine=emulator&loopback=1"
SIW_6_12 = "6.12.38+deb13-amd64"

# This machine has no RDMA device, so its agent runs the emulator engine, whose hello names no workaround.
# The channel below adds to the hello, on its way to the controller, what the verbs engine's hello says on a
# siw host running 6.12 (quirks.applied, as VerbsEngine.hello computes it, with the driver named instead of read
# from sysfs). Everything after that line is the run's own: the agent, the local transport, the controller's
# Agent and KernelLog, HilBackend.known_differences, the plugin and the report.
SIW_HELLO = f"""
from hil.agent.engines.verbs import quirks
from hil.rpc import framing
from hil.transport.local import LocalChannel, LocalTransport


class SiwHello(LocalChannel):
    def readline(self, timeout):
        line = super().readline(timeout)
        try:
            message = framing.decode(line)
        except ValueError:
            return line
        hello = message.get("hello")
        if isinstance(hello, dict) and "workarounds" not in hello:
            hello["workarounds"] = [w.name for w in quirks.applied("siw", {SIW_6_12!r}, override="auto")]
            return framing.encode(message)
        return line


LocalTransport._spawn = lambda self, argv: SiwHello(self.label, argv)
"""
TEST = """
import pytest

@pytest.mark.san_rule("R3")
def test_one(san_backend):
    pass
"""


def test_a_workaround_s_row_is_what_it_declares() -> None:
    w = quirks.Workaround("w", "rxe", "the bug", "the engine's way", "R7", broken_from=(6, 12))
    row = workaround(w, ["lab2"])
    assert (row.kind, row.name, row.rule, row.what, row.instead, row.why, row.reproducer, row.hosts) == (
        "workaround", "w", "R7", "the bug", "the engine's way", "kernel-bug", "san-hil lab reproduce w", ("lab2",))
    assert row.implementation == "the verbs engine on rxe (kernels from 6.12)" and row.tests == ()


def test_every_workaround_s_reproducer_is_one_the_lab_runs() -> None:
    rows = every_workaround()
    assert [r.name for r in rows] == [w.name for w in quirks.WORKAROUNDS]
    for row, w in zip(rows, quirks.WORKAROUNDS, strict=True):
        assert w.name in REPRODUCERS and row.reproducer == w.reproducer == f"san-hil lab reproduce {w.name}"


@pytest.mark.parametrize(("fixed_in", "broken_from", "says"), [
    (None, None, "every kernel tested"), ((6, 12), None, "kernels before 6.12"),
    (None, (6, 12), "kernels from 6.12"), ((6, 13), (6, 1), "kernels from 6.1 before 6.13"),
])
def test_which_kernels_need_it(fixed_in: tuple[int, int] | None, broken_from: tuple[int, int] | None,
                               says: str) -> None:
    assert kernels(quirks.Workaround("w", "rxe", "bug", "does", "R14", fixed_in, broken_from)) == says


def test_the_hosts_that_apply_each_are_named() -> None:
    log = KernelLog()
    siw = [w.name for w in quirks.applied("siw", SIW_6_12, override="auto")]
    rxe = [w.name for w in quirks.applied("rxe", "6.1.0-28-amd64", override="auto")]
    log.host("lab1", SIW_6_12, None, siw)
    log.host("lab2", SIW_6_12, None, siw)
    log.host("lab3", "6.1.0-28-amd64", None, rxe)
    log.host("lab4", "6.1.0-28-amd64", None)  # an engine that applies none (the emulator's)
    rows = applied_on(log.record)
    assert [(r.name, r.hosts) for r in rows] == [(name, ("lab1", "lab2")) for name in siw] + [
        (name, ("lab3",)) for name in rxe]
    assert all(r.to_dict(True)["observed"] for r in rows)


def test_a_name_the_controller_does_not_know_is_listed_not_dropped() -> None:
    (row,) = applied_on({"lab1": {"workarounds": ["newer-kernel-bug"]}})
    assert (row.name, row.hosts, row.what) == ("newer-kernel-bug", ("lab1",), "(not in this controller's quirks.py)")


def test_a_row_is_its_workaround() -> None:
    w = quirks.WORKAROUNDS[0]
    assert workaround(w, ["lab1"]).to_dict(True)["hosts"] == ["lab1"]


def test_a_host_s_workarounds_reach_the_report(pytester: pytest.Pytester) -> None:
    """A real agent over the local transport; its hello names the workarounds a siw host on 6.12 applies."""
    pytester.makeconftest(SIW_HELLO)
    pytester.makepyfile(test_one=TEST)
    result = pytester.runpytest_subprocess("--san-backend=hil", f"--san-hosts={LOCAL}",
                                           "--san-report", "report.json")
    result.assert_outcomes(passed=1)
    report: dict[str, Any] = json.loads((pytester.path / "report.json").read_text())
    expected = [w.name for w in quirks.applied("siw", SIW_6_12, override="auto")]
    assert expected  # siw on 6.12 needs some
    (host,) = report["kernel_resources"]
    assert report["kernel_resources"][host]["workarounds"] == expected
    listed = [e for e in report["deviations"] if e["kind"] == "workaround"]
    assert [(e["name"], e["hosts"], e["observed"]) for e in listed] == [(name, [host], True) for name in expected]
    assert listed[0] == workaround(quirks.WORKAROUNDS[0], [host]).to_dict(True)
    result.stdout.fnmatch_lines([f"workaround R14 (kernel-bug) {expected[0]} by the verbs engine on siw "
                                 f"(every kernel tested) on {host} [applied]"])
