"""Backends from other packages: found by name in the ``pytest_san.backends`` entry-point group and
imported only when ``--san-backend`` chooses them; pytest-san is one ``pytest11`` plugin that a
project can switch off, and a project's own ``hil`` package is none of its business."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

# A backend plugin in its own (fake) installed distribution: it notes every import of itself.
PLUGIN = """
    from pathlib import Path

    from pytest_san.spi.emulator import EmulatorBackend

    with open(Path(__file__).with_name("imported.txt"), "a") as f:
        f.write("imported\\n")


    class LoggingBackend(EmulatorBackend):
        name = "logging"


    def pytest_san_backend_names(config):
        return ["logging"]


    def pytest_san_make_backend(config, name):
        return LoggingBackend() if name == "logging" else None
"""

SAN_TEST = """
    def test_rdma(san_switch, san_backend):
        conn = san_switch.connect()
        assert conn.local.socket is not None
        assert san_backend.name == {name!r}
"""


@pytest.fixture
def installed(pytester: pytest.Pytester) -> pytest.Pytester:
    """A directory with ``logging_backend`` (a module) and a dist-info declaring it a SAN backend."""
    pytester.makepyfile(logging_backend=PLUGIN)
    info = pytester.mkdir("logging_backend-1.0.dist-info")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: logging-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest_san.backends]\nlogging = logging_backend\n")
    pytester.syspathinsert()  # for the entry point lookup in this process, too
    return pytester


def test_installed_backends_are_known_by_name(installed: pytest.Pytester) -> None:
    assert "logging" in {ep.name for ep in entry_points(group="pytest_san.backends")}


def test_a_backend_plugin_is_imported_only_when_chosen(installed: pytest.Pytester) -> None:
    installed.makepyfile(test_a=SAN_TEST.format(name="emulator"))
    installed.runpytest_subprocess().assert_outcomes(passed=1)
    assert not (installed.path / "imported.txt").exists()

    installed.makepyfile(test_a=SAN_TEST.format(name="logging"))
    installed.runpytest_subprocess("--san-backend=logging").assert_outcomes(passed=1)
    assert (installed.path / "imported.txt").read_text() == "imported\n"


def test_unknown_backend_lists_the_installed_ones(installed: pytest.Pytester) -> None:
    installed.makepyfile(test_a=SAN_TEST.format(name="x"))
    result = installed.runpytest_subprocess("--san-backend=nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown SAN backend 'nosuch'*'emulator'*'hil'*'logging'*"])


def test_backend_plugin_that_cannot_be_imported_is_one_usage_error(installed: pytest.Pytester) -> None:
    (installed.path / "logging_backend.py").write_text("import no_such_module_anywhere\n")
    installed.makepyfile(test_a=SAN_TEST.format(name="logging"))
    result = installed.runpytest_subprocess("--san-backend=logging")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--san-backend=logging: its plugin logging_backend (from logging-backend) "
                                 "cannot be imported: No module named 'no_such_module_anywhere'*"])
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


@pytest.fixture
def own_hil(pytester: pytest.Pytester) -> pytest.Pytester:
    """A downstream project with a ``hil`` package of its own (nothing to do with pytest-san's)."""
    pkg = pytester.mkpydir("hil")
    (pkg / "__init__.py").write_text("WHAT = 'our own hardware-in-the-loop rig'\n")
    pytester.makepyfile(test_rig="""
        import hil

        def test_our_hil():
            assert hil.WHAT == 'our own hardware-in-the-loop rig'
    """)
    return pytester


def test_no_san_runs_a_project_with_its_own_hil_package(own_hil: pytest.Pytester) -> None:
    result = own_hil.runpytest_subprocess("-p", "no:san")
    result.assert_outcomes(passed=1)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_own_hil_package_breaks_nothing_unless_the_hil_backend_is_chosen(own_hil: pytest.Pytester) -> None:
    own_hil.makepyfile(test_san=SAN_TEST.format(name="emulator"))
    own_hil.runpytest_subprocess().assert_outcomes(passed=2)


def test_pytest_san_is_one_pytest11_plugin() -> None:
    ours = [ep for ep in entry_points(group="pytest11") if ep.dist is not None and ep.dist.name == "pytest-san"]
    assert [(ep.name, ep.value) for ep in ours] == [("san", "pytest_san.plugin")]
