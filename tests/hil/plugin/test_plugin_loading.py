"""Loading the hil backend's plugin: no PytestAssertRewriteWarning in any run with ``--san-backend=hil``.

pytest-san registers ``hil.plugin`` when ``--san-backend=hil`` is chosen; ``san-hil nightly`` also gives its
runs ``-p hil.plugin.nightly``, which pytest imports first, and with it the package ``hil.plugin``. Marking
that package for assertion rewriting afterwards warned "Module already imported so cannot be rewritten" in
every nightly run; the package (no assertions in it) opts out of rewriting.
"""

from __future__ import annotations

import pytest

TEST_HOSTS = """
def test_hosts(san_backend):
    assert [(a.host.connection, a.host.engine) for a in san_backend.agents] == [("local", "emulator")]
"""


@pytest.mark.parametrize("plugins", [[], ["-p", "hil.plugin.nightly"]], ids=["backend", "with-nightly-plugin"])
def test_the_hil_plugin_loads_without_an_assert_rewrite_warning(pytester: pytest.Pytester,
                                                               plugins: list[str]) -> None:
    pytester.makepyfile(test_hosts=TEST_HOSTS)
    result = pytester.runpytest_subprocess(*plugins, "--san-backend=hil",
                                           "--san-hosts=local://?engine=emulator&loopback=1",
                                           "-W", "error::pytest.PytestAssertRewriteWarning")
    result.assert_outcomes(passed=1, warnings=0)
    assert "PytestAssertRewriteWarning" not in result.stdout.str() + result.stderr.str()
