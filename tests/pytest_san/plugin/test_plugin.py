"""The pytest plugin, driven through pytester with a small fake backend (and once with the emulator)."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from pytest_san.report import RULE_IDS, ConformanceReport, TestResult, leak_rules
from tests.support import readme

# A backend that only does what the plugin needs: named "fake", leaks what a test puts in `live`,
# and logs when it is made and closed so tests can count.
FAKE_CONFTEST = """
    from __future__ import annotations

    import pytest

    from pytest_san import Leak


    def log(event):
        with open("backend-events.txt", "a") as f:
            f.write(event + "\\n")


    class FakeNode:
        def __init__(self, name):
            self.name = name
            self.provider = f"provider-{name}"
            self.proxy = f"proxy-{name}"


    class FakeBackend:
        name = "fake"
        faults = None

        def __init__(self, capabilities):
            self.capabilities = frozenset(capabilities)
            self.nodes = [FakeNode("n0"), FakeNode("n1")]
            self.live = []
            self.resets = 0

        def connect_sockets(self, a, b):
            raise NotImplementedError

        def leaks(self):
            return list(self.live)

        def reset(self):
            self.live.clear()
            self.resets += 1

        def close(self):
            log("closed")


    def pytest_san_backend_names(config):
        return ["fake"]


    def pytest_san_make_backend(config, name):
        if name == "fake":
            log("made")
            return FakeBackend({"rdma_read", "faults"})
        return None
"""


def _events(pytester: pytest.Pytester) -> list[str]:
    path = pytester.path / "backend-events.txt"
    return path.read_text().split() if path.exists() else []


def _report(pytester: pytest.Pytester, name: str = "san-report.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / name).read_text())
    return data


def _zero() -> dict[str, int]:
    return {"passed": 0, "failed": 0, "skipped": 0, "deviating": 0}


@pytest.fixture
def fake(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(FAKE_CONFTEST)
    return pytester


# --- options and ini ---------------------------------------------------------------------

def test_help_shows_the_san_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([
        "SAN conformance (pytest-san):",
        "*--san-backend=NAME*",
        "*--san-report=PATH*",
        "*san_backend (string):*",
    ])
    said = " ".join(result.stdout.str().split())  # argparse wraps the help texts
    assert "an Ansible inventory file, YAML or INI, with group_vars/ and host_vars/ beside it" in said
    assert "lab inventory (Ansible YAML or INI) for --san-backend=hil" in said
    assert "Ansible-style YAML" not in said


def test_default_backend_is_the_emulator(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["san backend: emulator"])
    assert result.ret == pytest.ExitCode.OK


def test_ini_chooses_the_backend_and_the_option_wins(fake: pytest.Pytester) -> None:
    fake.makeini("[pytest]\nsan_backend = fake\n")
    fake.makepyfile("def test_backend(san_backend): assert san_backend.name == 'fake'")
    fake.runpytest().assert_outcomes(passed=1)
    result = fake.runpytest("--san-backend", "emulator")
    result.stdout.fnmatch_lines(["san backend: emulator"])


def test_unknown_backend_is_a_usage_error_listing_known_names(fake: pytest.Pytester) -> None:
    fake.makepyfile("def test_nothing(): pass")
    result = fake.runpytest("--san-backend", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown SAN backend 'nope'*known backends: 'emulator', 'fake'*"])


def test_backend_is_built_once_lazily_and_closed(fake: pytest.Pytester) -> None:
    fake.makepyfile("""
        import pytest

        seen = []

        def test_plain():
            pass

        @pytest.mark.parametrize("i", range(3))
        def test_same_backend(san_backend, i):
            seen.append(san_backend)
            assert all(b is seen[0] for b in seen)
    """)
    fake.runpytest("--san-backend", "fake").assert_outcomes(passed=4)
    assert _events(fake) == ["made", "closed"]


def test_no_backend_without_san_tests(fake: pytest.Pytester) -> None:
    fake.makepyfile("def test_plain(): pass")
    result = fake.runpytest("--san-backend", "fake")
    result.assert_outcomes(passed=1)
    assert _events(fake) == []
    assert "SAN conformance" not in result.stdout.str()


# --- markers -------------------------------------------------------------------------------

def test_markers_pass_strict_markers(fake: pytest.Pytester) -> None:
    fake.makepyfile("""
        import pytest

        @pytest.mark.san_rule("R1", "P5")
        @pytest.mark.san_requires("rdma_read")
        def test_marked():
            pass
    """)
    fake.runpytest("--strict-markers", "--san-backend", "fake").assert_outcomes(passed=1)


def test_unknown_rule_id_is_a_collection_error(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_bad="""
        import pytest

        @pytest.mark.san_rule("R1", "R99")
        def test_typo():
            pass

        def test_fine():
            pass
    """)
    result = fake.runpytest("--san-backend", "fake")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        "*ERROR collecting test_bad.py*",
        "test_bad.py::test_typo: unknown SAN rule id 'R99' in san_rule*",
    ])


def test_rule_ids_on_a_class_are_checked_too(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_cls="""
        import pytest

        @pytest.mark.san_rule("R14", "Q1")
        class TestThing:
            def test_a(self):
                pass
    """)
    result = fake.runpytest("--san-backend", "fake")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["test_cls.py::TestThing::test_a: unknown SAN rule id 'Q1'*"])


def test_missing_capability_skips_with_reason(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_caps="""
        import pytest

        @pytest.mark.san_rule("R6")
        @pytest.mark.san_requires("verbs")
        def test_needs_verbs():
            raise AssertionError("must not run")

        @pytest.mark.san_requires("rdma_read", "verbs", "memory_windows")
        def test_needs_two_missing():
            raise AssertionError("must not run")

        @pytest.mark.san_requires("rdma_read")
        def test_has_it():
            pass
    """)
    result = fake.runpytest("--san-backend", "fake", "-rs", "--san-report", "san-report.json")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "SKIPPED*test_caps.py:*backend 'fake' lacks capability 'verbs'",
        "SKIPPED*backend 'fake' lacks capabilities 'verbs', 'memory_windows'",
    ])
    data = _report(fake)
    assert data["rules"]["R6"] == {"passed": 0, "failed": 0, "skipped": 1, "deviating": 0}
    first = data["tests"][0]
    assert first == {"nodeid": "test_caps.py::test_needs_verbs", "rules": ["R6"], "outcome": "skipped",
                     "reason": "backend 'fake' lacks capability 'verbs'"}


# --- capabilities per node, from the provider and proxy under test ---------------------------

NODE_CAPABILITIES = """
    import pytest

    @pytest.mark.san_requires("rdma_read")
    def test_pair_reads(san_switch):
        pass

    @pytest.mark.san_requires("rdma_read")
    def test_first_node_reads(san_proxy):
        pass

    @pytest.mark.san_requires("rdma_read")
    @pytest.mark.san_nodes(3)
    def test_three_nodes_read(san_switch):
        pass

    @pytest.mark.san_requires("contiguous")
    def test_contiguous(san_proxy):
        pass

    @pytest.mark.san_requires("tracing")
    def test_traced(san_proxy):
        pass
"""

NO_READ_ON_THE_SECOND_NODE = """
    from collections.abc import Mapping

    class NoRead:
        supports_rdma_read = False

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class NoContiguous:
        san_capabilities: Mapping[str, bool] = {"contiguous": False, "tracing": True}

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

    def pytest_san_make_provider(config, node, provider):
        return NoRead(provider) if node.name == "node1" else None

    def pytest_san_make_proxy(config, node, proxy):
        return NoContiguous(proxy)
"""


def test_capabilities_come_from_each_nodes_provider_and_proxy(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(NO_READ_ON_THE_SECOND_NODE)
    pytester.makepyfile(test_caps=NODE_CAPABILITIES)
    result = pytester.runpytest("-rs", "--san-report", "san-report.json")
    result.assert_outcomes(passed=2, skipped=3)
    result.stdout.fnmatch_lines([
        "SKIPPED*provider NoRead lacks capability 'rdma_read' on node node1 (its supports_rdma_read is false)",
        "SKIPPED*provider NoRead lacks capability 'rdma_read' on node node1 (its supports_rdma_read is false)",
        "SKIPPED*proxy NoContiguous lacks capability 'contiguous' (its san_capabilities maps it to False)",
    ])
    outcomes = {t["nodeid"].split("::")[1]: t["outcome"] for t in _report(pytester)["tests"]}
    assert outcomes == {"test_pair_reads": "skipped", "test_first_node_reads": "passed",
                        "test_three_nodes_read": "skipped", "test_contiguous": "skipped", "test_traced": "passed"}
    data = _report(pytester)
    assert "rdma_read" not in data["capabilities"] and "contiguous" not in data["capabilities"]
    assert "tracing" in data["capabilities"]
    assert "rdma_read" in data["node_capabilities"]["node0"] and "rdma_read" in data["node_capabilities"]["node2"]
    assert "rdma_read" not in data["node_capabilities"]["node1"]


def test_node_capabilities_hook_has_the_last_word(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        def pytest_san_node_capabilities(config, node, capabilities):
            if node.name == "node0":
                capabilities.discard("rdma_read")
                capabilities.add("tracing")
    """)
    pytester.makepyfile(test_caps=NODE_CAPABILITIES)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=2, skipped=3)  # every rdma_read test: node0 is the first node of each
    result.stdout.fnmatch_lines(["SKIPPED*test_caps.py:7: a pytest_san_node_capabilities hook (conftest.py) "
                                 "discarded capability 'rdma_read' on node node0"])


def test_a_replaced_provider_does_not_inherit_the_backends_claims_about_its_own(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        from pytest_san.spi.emulator import backend

        backend.CAPABILITIES = backend.CAPABILITIES | {"reference_order"}

        class Same:
            def __init__(self, inner):
                self.inner = inner

            def __getattr__(self, name):
                return getattr(self.inner, name)

        def pytest_san_make_provider(config, node, provider):
            return Same(provider) if node.name == "node1" else None
    """)
    pytester.makepyfile("def test_any(san_backend): pass")
    pytester.runpytest("--san-report", "san-report.json").assert_outcomes(passed=1)
    nodes = _report(pytester)["node_capabilities"]
    assert "reference_order" in nodes["node0"] and "reference_order" not in nodes["node1"]
    assert "rdma_read" in nodes["node1"]  # what the wrapper forwards is its own


def test_a_bad_san_capabilities_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        class Odd:
            san_capabilities = ["rdma_read"]

            def __init__(self, inner):
                self.inner = inner

            def __getattr__(self, name):
                return getattr(self.inner, name)

        def pytest_san_make_provider(config, node, provider):
            return Odd(provider)
    """)
    pytester.makepyfile("def test_any(san_backend): pass")
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*san_capabilities of *Odd* must map capability names to True or False*"])


# --- the report ----------------------------------------------------------------------------

REPORTED_TESTS = """
    import pytest

    @pytest.mark.san_rule("R1", "R2")
    def test_pass(san_backend):
        pass

    @pytest.mark.san_rule("R2")
    def test_fail(san_provider):
        assert san_provider == "provider-n1", "wrong node"

    @pytest.mark.san_rule("R3")
    def test_skip():
        pytest.skip("not today")

    @pytest.mark.san_rule("R4")
    @pytest.mark.xfail(reason="known gap")
    def test_xfail():
        assert False

    @pytest.fixture
    def broken():
        raise RuntimeError("setup broke")

    @pytest.mark.san_rule("P1")
    def test_setup_error(broken):
        pass

    def test_san_but_unmarked(san_proxy):
        assert san_proxy == "proxy-n0"

    def test_not_san():
        pass
"""


def test_report_json_counts_every_rule(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_rep=REPORTED_TESTS)
    result = fake.runpytest("--san-backend", "fake", "--san-report", "out/san-report.json")
    result.assert_outcomes(passed=3, failed=1, skipped=1, xfailed=1, errors=1)
    data = _report(fake, "out/san-report.json")
    assert list(data) == ["backend", "capabilities", "node_capabilities", "rules", "tests", "deviations"]
    assert data["backend"] == "fake"
    assert data["capabilities"] == ["faults", "rdma_read"]
    assert data["node_capabilities"] == {"n0": ["faults", "rdma_read"], "n1": ["faults", "rdma_read"]}
    assert list(data["rules"]) == list(RULE_IDS)
    expected = {rule: _zero() for rule in RULE_IDS}
    expected["R1"] = {"passed": 1, "failed": 0, "skipped": 0, "deviating": 0}
    expected["R2"] = {"passed": 1, "failed": 1, "skipped": 0, "deviating": 0}
    expected["R3"] = {"passed": 0, "failed": 0, "skipped": 1, "deviating": 0}
    expected["R4"] = {"passed": 0, "failed": 0, "skipped": 1, "deviating": 0}
    expected["P1"] = {"passed": 0, "failed": 1, "skipped": 0, "deviating": 0}
    assert data["rules"] == expected
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}
    assert set(tests) == {"test_pass", "test_fail", "test_skip", "test_xfail", "test_setup_error",
                          "test_san_but_unmarked"}
    assert tests["test_pass"] == {"nodeid": "test_rep.py::test_pass", "rules": ["R1", "R2"],
                                  "outcome": "passed", "reason": ""}
    assert tests["test_fail"]["outcome"] == "failed"
    assert "wrong node" in tests["test_fail"]["reason"]
    assert tests["test_skip"]["reason"] == "not today"
    assert tests["test_xfail"]["reason"] == "xfail: known gap"
    assert tests["test_setup_error"]["reason"] == "error in setup: RuntimeError: setup broke"
    assert tests["test_san_but_unmarked"] == {"nodeid": "test_rep.py::test_san_but_unmarked", "rules": [],
                                              "outcome": "passed", "reason": ""}


def test_report_without_san_tests_has_all_rules_at_zero(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain(): pass")
    pytester.runpytest("--san-report", "san-report.json").assert_outcomes(passed=1)
    assert _report(pytester) == {"backend": "emulator", "capabilities": [], "node_capabilities": {},
                                 "rules": {rule: _zero() for rule in RULE_IDS}, "tests": [], "deviations": []}


def test_conformance_hook_can_add_to_the_report(fake: pytest.Pytester) -> None:
    fake.makeconftest(FAKE_CONFTEST + """

    def pytest_san_conformance(config, report):
        report["lab"] = {"hosts": len(report["tests"])}
    """)
    fake.makepyfile("""
        import pytest

        @pytest.mark.san_rule("R9")
        def test_one(san_backend):
            pass
    """)
    fake.runpytest("--san-backend", "fake", "--san-report", "san-report.json").assert_outcomes(passed=1)
    data = _report(fake)
    assert data["lab"] == {"hosts": 1}
    assert data["rules"]["R9"]["passed"] == 1


def test_terminal_table(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_rep=REPORTED_TESTS)
    result = fake.runpytest("--san-backend", "fake", "--san-report", "san-report.json")
    result.stdout.re_match_lines([
        r"=+ SAN conformance =+",
        r"backend: fake  capabilities: faults, rdma_read",
        r"rule +passed +failed +skipped",
        r"R1 +1 +0 +0",
        r"R2 +1 +1 +0",
        r"R3 +0 +0 +1",
        r"R4 +0 +0 +1",
        r"P1 +0 +1 +0",
        r"\(14 of 19 rules not exercised\)",
        r"report written to .*san-report.json",
    ])


# --- the leak check ------------------------------------------------------------------------

LEAKY_TESTS = """
    import pytest
    from pytest_san import Leak

    @pytest.mark.san_rule("R3")
    def test_leaks(san_backend):
        san_backend.live += [Leak("n0", "registration", "memory 0x1000+4096"),
                             Leak("n1", "allocation", "8192 bytes")]

    @pytest.mark.san_rule("R3")
    def test_after(san_backend):
        assert san_backend.live == [] and san_backend.resets == 1
"""


def test_leak_fails_the_test_and_counts_against_r11(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_leak=LEAKY_TESTS)
    result = fake.runpytest("--san-backend", "fake", "--san-report", "san-report.json")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaks*",
        "SAN leak (R11): 2 registration(s), allocation(s) or pin(s) still alive after the test's sockets*",
        "  n0: registration memory 0x1000+4096",
        "  n1: allocation 8192 bytes",
    ])
    data = _report(fake)
    assert data["rules"]["R3"] == {"passed": 1, "failed": 1, "skipped": 0, "deviating": 0}
    assert data["rules"]["R11"] == {"passed": 0, "failed": 1, "skipped": 0, "deviating": 0}
    leaked = data["tests"][0]
    assert leaked["rules"] == ["R3", "R11"] and leaked["outcome"] == "failed"
    assert leaked["reason"] == "R11 leak: n0: registration memory 0x1000+4096; n1: allocation 8192 bytes"


def test_leak_check_ignores_tests_without_san_fixtures(fake: pytest.Pytester) -> None:
    fake.makepyfile("""
        from pytest_san import Leak

        holder = []

        def test_first(san_backend):
            holder.append(san_backend)

        def test_plain():
            # uses no SAN fixture: its leak is not checked after it...
            holder[0].live.append(Leak("n0", "allocation", "4096 bytes"))

        def test_checked(san_backend):
            pass  # ...but after the next SAN test
    """)
    result = fake.runpytest("--san-backend", "fake")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_checked*"])


def test_switch_is_closed_before_the_leak_check(fake: pytest.Pytester) -> None:
    fake.makeconftest(FAKE_CONFTEST + """

    class FakeSwitch:
        def __init__(self, backend):
            self.backend = backend

        def connect(self, peer=None, process=None, **options):
            self.backend.live.append(Leak("n0", "registration", "switch message region"))
            return "connection"

        def close_all(self):
            log("close_all")
            self.backend.live.clear()


    @pytest.fixture(autouse=True)
    def fake_switch(monkeypatch):
        import pytest_san.switch
        monkeypatch.setattr(pytest_san.switch, "Switch", FakeSwitch)
    """)
    fake.makepyfile("""
        def test_connects(san_switch):
            assert san_switch.connect() == "connection"
            assert san_switch.backend.live
    """)
    fake.runpytest("--san-backend", "fake").assert_outcomes(passed=1)
    assert _events(fake) == ["made", "close_all", "closed"]


def test_unmarked_leaky_test_still_counts_r11(fake: pytest.Pytester) -> None:
    fake.makepyfile("""
        from pytest_san import Leak

        def test_leaks(san_backend):
            san_backend.live.append(Leak("n0", "allocation", "4096 bytes"))
    """)
    fake.runpytest("--san-backend", "fake", "--san-report", "r.json").assert_outcomes(passed=1, errors=1)
    data = _report(fake, "r.json")
    assert data["rules"]["R11"]["failed"] == 1
    assert sum(sum(row.values()) for row in data["rules"].values()) == 1


# --- hooks replacing the backend ------------------------------------------------------------

def test_make_backend_hook_replaces_the_default(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKE_CONFTEST.replace('if name == "fake":', 'if name == "emulator":'))
    pytester.makepyfile("""
        def test_backend(san_backend, san_provider, san_proxy):
            assert san_backend.name == "fake"
            assert (san_provider, san_proxy) == ("provider-n0", "proxy-n0")
    """)
    pytester.runpytest().assert_outcomes(passed=1)
    assert _events(pytester) == ["made", "closed"]


# --- with the real emulator -------------------------------------------------------------------

def test_spec_example_on_the_emulator(pytester: pytest.Pytester) -> None:
    """The README's example, counted under a rule (R2: its descriptor serves the connected peer)."""
    pytester.makepyfile(test_example='import pytest\n\npytestmark = pytest.mark.san_rule("R2")\n' + readme.example())
    result = pytester.runpytest("--san-report", "san-report.json")
    result.assert_outcomes(passed=1)
    data = _report(pytester)
    assert data["backend"] == "emulator"
    assert "rdma_read" in data["capabilities"]
    assert data["rules"]["R2"] == {"passed": 1, "failed": 0, "skipped": 0, "deviating": 0}
    assert data["rules"]["R11"] == _zero()


def test_provider_and_proxy_hooks_wrap_the_emulator(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        class Wrapped:
            def __init__(self, inner, node):
                self.inner, self.node = inner, node

            def __getattr__(self, name):
                return getattr(self.inner, name)

        class WrappedProxy(Wrapped):
            pass

        class WrappedProvider(Wrapped):
            pass

        def pytest_san_make_proxy(config, node, proxy):
            return WrappedProxy(proxy, node)

        def pytest_san_make_provider(config, node, provider):
            return WrappedProvider(provider, node)
    """)
    pytester.makepyfile("""
        def test_wrapped(san_backend, san_provider, san_proxy):
            assert type(san_provider).__name__ == "WrappedProvider"
            assert type(san_proxy).__name__ == "WrappedProxy"
            assert san_provider.node is san_backend.nodes[0] is san_proxy.node
            assert [n.provider.node for n in san_backend.nodes] == list(san_backend.nodes)
    """)
    pytester.runpytest().assert_outcomes(passed=1)


def test_emulator_leak_is_caught(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        from pytest_san import Access

        @pytest.mark.san_rule("R13")
        def test_forgets_to_close(san_backend, san_provider):
            node = san_backend.nodes[0]
            a, _ = san_backend.connect_sockets(node.default_process, san_backend.nodes[1].default_process)
            buf = node.default_process.alloc(4096)
            san_provider.register_memory(a, buf, Access.READWRITE)

        def test_clean_afterwards(san_backend):
            assert san_backend.leaks() == []
    """)
    result = pytester.runpytest("--san-report", "san-report.json")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["SAN leak (R11):*"])
    data = _report(pytester)
    assert data["rules"]["R11"]["failed"] == 1 and data["rules"]["R13"]["failed"] == 1


# --- pytest-xdist ---------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist not installed")
def test_xdist_workers_reports_are_merged(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_rep=REPORTED_TESTS)
    result = fake.runpytest_subprocess("-n", "2", "--san-backend", "fake", "--san-report", "san-report.json")
    result.assert_outcomes(passed=3, failed=1, skipped=1, xfailed=1, errors=1)
    data = _report(fake)
    assert data["backend"] == "fake" and data["capabilities"] == ["faults", "rdma_read"]
    assert data["rules"]["R2"] == {"passed": 1, "failed": 1, "skipped": 0, "deviating": 0}
    assert len(data["tests"]) == 6
    result.stdout.fnmatch_lines(["*SAN conformance*"])


# --- ConformanceReport on its own ----------------------------------------------------------

def test_a_pin_leak_counts_against_r12_too() -> None:
    """A page the kernel still holds pinned for nothing (hil's pin witness, kind "pin") breaks R12 as well as R11;
    other leaks R11 alone."""
    assert leak_rules([]) == []
    assert leak_rules(["n0: registration memory 0x1000+4096", "n1: allocation 8192 bytes"]) == ["R11"]
    assert leak_rules(["lab1: registration x", "lab1: pin with the leak check: pid 7 has 2 page(s) pinned"]) == \
        ["R11", "R12"]
    assert leak_rules(["lab1: pinned-ish allocation"]) == ["R11"]  # the kind is the word, not a prefix
    report = ConformanceReport("hil", set())
    report.record("t.py::p", ["P2"], "passed", leaked=True, leak_ids=leak_rules(["lab1: pin x"]))
    assert report.tests[0].rules == ("R11", "R12", "P2") and report.tests[0].outcome == "failed"


def test_report_record_and_round_trip() -> None:
    report = ConformanceReport("emulator", {"rdma_read"})
    report.record("t.py::a", ["R2", "R1", "R2"], "passed")
    report.record("t.py::b", ["R1"], "passed", leaked=True)
    assert report.tests[0] == TestResult("t.py::a", ("R1", "R2"), "passed")
    assert report.tests[1].outcome == "failed" and report.tests[1].rules == ("R1", "R11")
    counts = report.counts()
    assert counts["R1"] == {"passed": 1, "failed": 1, "skipped": 0, "deviating": 0}
    assert counts["R11"] == {"passed": 0, "failed": 1, "skipped": 0, "deviating": 0}
    again = ConformanceReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.to_dict() == report.to_dict()
    with pytest.raises(ValueError, match="R15"):
        report.record("t.py::c", ["R15"], "passed")


def test_report_merge() -> None:
    left = ConformanceReport("emulator", {"a"})
    left.record("x::1", ["P3"], "skipped", "no")
    right = ConformanceReport("emulator", {"b"})
    right.record("x::2", ["P3"], "passed")
    left.merge(right)
    assert left.capabilities == {"a", "b"}
    assert left.counts()["P3"] == {"passed": 1, "failed": 0, "skipped": 1, "deviating": 0}
    with pytest.raises(ValueError, match="hil"):
        left.merge(ConformanceReport("hil"))
    empty = ConformanceReport()
    empty.merge(left)
    assert empty.backend == "emulator" and len(empty.tests) == 2
