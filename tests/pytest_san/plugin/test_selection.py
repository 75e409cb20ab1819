"""``--san-rules`` and ``--san-sample``: which scenarios run, driven through pytester with test_plugin's fake
backend (capabilities ``rdma_read`` and ``faults``)."""

from __future__ import annotations

import re

import pytest

from .test_plugin import FAKE_CONFTEST

# Per rule: R1 has 6 runnable tests, R2 one runnable among 4 that need what the backend lacks, R3 a test also
# marked R1; and one test marked with no rule.
TESTS = """
    import pytest

    @pytest.mark.parametrize("n", range(6))
    @pytest.mark.san_rule("R1")
    def test_r1(n):
        pass

    @pytest.mark.parametrize("n", range(4))
    @pytest.mark.san_rule("R2")
    @pytest.mark.san_requires("contiguous")
    def test_r2_needs_contiguous(n):
        pass

    @pytest.mark.san_rule("R2")
    @pytest.mark.san_requires("rdma_read")
    def test_r2_runs():
        pass

    @pytest.mark.san_rule("R1", "R3")
    def test_r1_and_r3():
        pass

    def test_no_rule():
        pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def _selected(result: pytest.RunResult) -> list[str]:
    return sorted(line.split("::", 1)[1] for line in result.outlines if line.startswith("test_suite.py::"))


def _collect(suite: pytest.Pytester, *args: str) -> list[str]:
    result = suite.runpytest("--san-backend", "fake", "--co", "-q", *args)
    assert result.ret == pytest.ExitCode.OK, result.outlines
    return _selected(result)


def test_san_rules_keeps_the_tests_of_the_rules_named(suite: pytest.Pytester) -> None:
    assert _collect(suite, "--san-rules", "R3,R2") == sorted(
        ["test_r1_and_r3", "test_r2_runs"] + [f"test_r2_needs_contiguous[{n}]" for n in range(4)])


def test_san_rules_names_an_unknown_rule(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--san-backend", "fake", "--san-rules", "R1,R15")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--san-rules R1,R15: unknown rule id(s) R15*"])


def test_a_sample_keeps_n_a_rule_runnable_ones_first(suite: pytest.Pytester) -> None:
    selected = _collect(suite, "--san-sample", "1")
    # R3 draws first (it has the fewest), and its one test stands for R1 too.
    assert [name for name in selected if name.startswith("test_r1")] == ["test_r1_and_r3"]
    assert "test_r2_runs" in selected
    assert not [name for name in selected if name.startswith("test_r2_needs")]
    assert "test_no_rule" in selected


def test_a_sample_takes_skipped_ones_only_when_runnable_ones_run_out(suite: pytest.Pytester) -> None:
    selected = _collect(suite, "--san-sample", "3")
    assert len([name for name in selected if name.startswith("test_r1")]) == 3
    assert len([name for name in selected if name.startswith("test_r2_needs")]) == 2


def test_a_sample_is_the_same_for_a_seed_and_says_what_it_kept(suite: pytest.Pytester) -> None:
    runs = [suite.runpytest("--san-backend", "fake", "--co", "-q", "--san-sample", "2", "--san-sample-seed", "5")
            for _ in range(2)]
    assert _selected(runs[0]) == _selected(runs[1])
    line = next(line for line in runs[0].outlines if line.startswith("san sample:"))
    assert re.fullmatch(rf"san sample: {len(_selected(runs[0]))} of 13 tests, 2 a rule "
                        r"\(--san-sample 2 --san-sample-seed 5\)", line)


def test_seeds_draw_different_samples(suite: pytest.Pytester) -> None:
    # R1 alone has 6 tests: 8 seeds drawing 1 each cannot all agree unless the seed is ignored.
    draws = {tuple(_collect(suite, "--san-sample", "1", "--san-sample-seed", str(seed), "-k", "test_r1 and not r3"))
             for seed in range(8)}
    assert len(draws) > 1


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_sample_needs_a_count_of_at_least_one(suite: pytest.Pytester, value: str) -> None:
    result = suite.runpytest("--san-backend", "fake", f"--san-sample={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--san-sample: expected a number >= 1, got '{value}'*"])
