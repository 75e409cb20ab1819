"""Which mutants a run tries (mutation/select.py): the files a change touched in a real git repository, or a
seeded sample."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from mutation.select import changed_files, mutated_among, sample

PATTERNS = ["pytest_san/spi/checks.py", "pytest_san/spi/emulator/proxy.py", "pytest_san/switch/*.py"]


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                   check=True, capture_output=True)


def test_the_files_changed_since_a_base_committed_staged_in_the_tree_or_new(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    for name in ("pytest_san/spi/checks.py", "pytest_san/spi/emulator/proxy.py", "pytest_san/switch/endpoint.py",
                 "README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "base")
    git(tmp_path, "checkout", "-q", "-b", "change")
    (tmp_path / "pytest_san/spi/checks.py").write_text("x = 2\n")
    git(tmp_path, "commit", "-q", "-am", "committed")
    (tmp_path / "pytest_san/spi/emulator/proxy.py").write_text("x = 3\n")  # only in the work tree
    (tmp_path / "pytest_san/switch/new.py").write_text("y = 1\n")  # new, untracked
    (tmp_path / "README.md").write_text("changed\n")

    changed = changed_files(tmp_path, "main")
    assert changed == ["README.md", "pytest_san/spi/checks.py", "pytest_san/spi/emulator/proxy.py",
                       "pytest_san/switch/new.py"]
    assert mutated_among(changed, PATTERNS) == ["pytest_san/spi/checks.py", "pytest_san/spi/emulator/proxy.py",
                                                "pytest_san/switch/new.py"]
    assert changed_files(tmp_path, "no-such-ref") is None
    assert changed_files(tmp_path / "pytest_san", "main") is not None  # from inside the repository too


def test_no_repository_is_none(tmp_path: Path) -> None:
    assert changed_files(tmp_path, "HEAD~1") is None


def test_only_python_files_mutation_covers() -> None:
    assert mutated_among(["pytest_san/switch/README.md", "pytest_san/spi/emulator/sockets.py", "tests/x.py"],
                         PATTERNS) == []


def test_the_sample_depends_on_the_seed_and_the_mutants_not_their_order() -> None:
    names = [f"m{i}" for i in range(1000)]
    first = sample(names, 50, seed=1)
    assert len(first) == 50 and set(first) <= set(names)
    assert sample(list(reversed(names)), 50, seed=1) == first
    assert sample(names, 50, seed=2) != first
    assert sample(names[:10], 50, seed=1) == sorted(names[:10])


def test_tests_that_share_a_session_fixture_run_together() -> None:
    from mutation.runner import run_together

    model = [f"pytest_san/scenarios/test_model.py::test_m[R{i}]" for i in range(1, 4)]
    stats: dict[str, Any] = {"duration_by_test": dict.fromkeys([*model, "pytest_san/scenarios/test_a.py::test_a"], 0.1),
             "tests_by_mangled_function_name": {
                 "m.f": [model[0]],  # the model's work, recorded under its first test
                 "m.g": ["pytest_san/scenarios/test_a.py::test_a"],
                 "m.h": ["pytest_san/scenarios/test_a.py::test_a", model[0]]}}
    assert run_together(stats, ["pytest_san/scenarios/test_model.py::*"]) == 2
    tests = stats["tests_by_mangled_function_name"]
    assert tests["m.f"] == sorted(model)
    assert tests["m.g"] == ["pytest_san/scenarios/test_a.py::test_a"]
    assert tests["m.h"] == sorted([*model, "pytest_san/scenarios/test_a.py::test_a"])
    assert run_together(stats, ["pytest_san/scenarios/test_model.py::*"]) == 0


def test_the_constructors_mutants_get_every_test() -> None:
    from mutation.runner import run_all_for

    stats: dict[str, Any] = {"duration_by_test": {"t1": 0.1, "t2": 0.1, "t3": 0.1},
                             "tests_by_mangled_function_name": {"m.xǁProxyǁ__init__": ["t1"], "m.xǁProxyǁfree": ["t2"]}}
    assert run_all_for(stats, ["*ǁ__init__"]) == 1
    assert stats["tests_by_mangled_function_name"] == {"m.xǁProxyǁ__init__": ["t1", "t2", "t3"],
                                                       "m.xǁProxyǁfree": ["t2"]}


def test_a_files_own_tests_are_kept_to_its_functions() -> None:
    from mutation.runner import keep_to

    unit = "tests/pytest_san/test_batch.py::test_x"
    stats: dict[str, Any] = {"tests_by_mangled_function_name": {
        "pytest_san.batch.x_resolve": [unit, "s::a"], "pytest_san.spi.emulator.provider.x_send": ["s::a", unit]}}
    only = {"tests/pytest_san/test_batch.py::*": "pytest_san.batch.*"}
    assert keep_to(stats, only) == 1
    assert stats["tests_by_mangled_function_name"] == {"pytest_san.batch.x_resolve": [unit, "s::a"],
                                                       "pytest_san.spi.emulator.provider.x_send": ["s::a"]}
    assert keep_to(stats, only) == 0
