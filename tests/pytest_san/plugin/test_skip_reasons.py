"""A ``san_requires`` skip names what lacks the capability: the backend, the provider, the proxy or a hook
(issue 27: the docs' provider without RdmaRead was skipped as "backend 'emulator' lacks capability")."""

from __future__ import annotations

import pytest

FORWARDING = """
    class Forwarding:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)
"""

TESTS = """
    import pytest

    @pytest.mark.san_requires("rdma_read")
    def test_reads(san_switch):
        pass

    @pytest.mark.san_requires("contiguous")
    def test_contiguous(san_proxy):
        pass

    @pytest.mark.san_requires("rdma_read", "contiguous", "tracing")
    def test_three(san_switch):
        pass

    @pytest.mark.san_requires("faults")
    def test_faults(san_switch):
        pass
"""


def _skips(pytester: pytest.Pytester, *args: str) -> dict[str, str]:
    """test name -> its skip reason."""
    result = pytester.runpytest("-rs", *args)
    reasons = {}
    for line in result.outlines:
        if line.startswith("SKIPPED"):
            where, _, reason = line.partition(": ")
            reasons[where.rpartition(":")[2]] = reason
    return reasons


def test_a_provider_without_rdma_read_is_named(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FORWARDING + """
    class MyProvider(Forwarding):
        supports_rdma_read = False

    def pytest_san_make_provider(config, node, provider):
        return MyProvider(provider)
    """)
    pytester.makepyfile(test_caps=TESTS)
    reasons = _skips(pytester)
    assert reasons["3"] == "provider MyProvider lacks capability 'rdma_read' (its supports_rdma_read is false)"
    assert reasons["11"] == ("provider MyProvider lacks capability 'rdma_read' (its supports_rdma_read is false); "
                             "backend 'emulator' lacks capability 'tracing'")
    assert "7" not in reasons and "15" not in reasons


def test_a_proxy_that_declares_a_capability_away_is_named(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FORWARDING + """
    class SmallProxy(Forwarding):
        san_capabilities = {"contiguous": False}

    def pytest_san_make_proxy(config, node, proxy):
        return SmallProxy(proxy)
    """)
    pytester.makepyfile(test_caps=TESTS)
    reasons = _skips(pytester)
    assert reasons["7"] == "proxy SmallProxy lacks capability 'contiguous' (its san_capabilities maps it to False)"
    assert reasons["11"] == ("proxy SmallProxy lacks capability 'contiguous' (its san_capabilities maps it to "
                             "False); backend 'emulator' lacks capability 'tracing'")


def test_one_nodes_provider_is_named_with_the_node(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FORWARDING + """
    class Declares(Forwarding):
        san_capabilities = {"rdma_read": False, "faults": False}

    def pytest_san_make_provider(config, node, provider):
        return Declares(provider) if node.name == "node1" else None
    """)
    pytester.makepyfile(test_caps=TESTS)
    reasons = _skips(pytester)
    assert reasons["3"] == ("provider Declares lacks capability 'rdma_read' on node node1 "
                            "(its san_capabilities maps it to False)")
    assert reasons["15"] == ("provider Declares lacks capability 'faults' on node node1 "
                             "(its san_capabilities maps it to False)")


def test_a_hook_that_discards_a_capability_is_named_with_its_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(no_faults="""
        def pytest_san_node_capabilities(config, node, capabilities):
            capabilities.discard("faults")
    """)
    pytester.makepyfile(test_caps=TESTS)
    pytester.syspathinsert()
    reasons = _skips(pytester, "-p", "no_faults")
    assert reasons["15"] == "a pytest_san_node_capabilities hook (no_faults) discarded capability 'faults'"


def test_what_a_provider_declares_back_is_not_missing(pytester: pytest.Pytester) -> None:
    """A capability the backend lacks and the provider declares is there: no skip, and nothing to blame."""
    pytester.makeconftest(FORWARDING + """
    class Traces(Forwarding):
        san_capabilities = {"tracing": True}

    def pytest_san_make_provider(config, node, provider):
        return Traces(provider)
    """)
    pytester.makepyfile(test_caps="""
        import pytest

        @pytest.mark.san_requires("tracing")
        def test_traced(san_switch):
            pass
    """)
    pytester.runpytest().assert_outcomes(passed=1)
