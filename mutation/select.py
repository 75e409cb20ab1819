"""Which mutants a run tries: the files a change touched (against a base ref), or a seeded sample."""

from __future__ import annotations

import fnmatch
import random
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path


def _git(root: Path, *args: str) -> list[str] | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [line for line in done.stdout.splitlines() if line]


def changed_files(root: Path, base: str) -> list[str] | None:
    """The files changed since the merge base of ``base`` and HEAD: committed, staged, in the work tree, or new
    and untracked. None when git cannot tell (no repository, an unknown ref, a shallow clone without it)."""
    merge_base = _git(root, "merge-base", base, "HEAD")
    if not merge_base:
        return None
    changed = _git(root, "diff", "--name-only", merge_base[0])
    untracked = _git(root, "ls-files", "--others", "--exclude-standard")
    if changed is None or untracked is None:
        return None
    return sorted(set(changed) | set(untracked))


def mutated_among(paths: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """Those of ``paths`` that mutation covers (``only_mutate``'s fnmatch patterns)."""
    return sorted({p for p in paths if p.endswith(".py") and any(fnmatch.fnmatch(p, pat) for pat in patterns)})


def sample(names: Iterable[str], size: int, seed: int) -> list[str]:
    """``size`` of ``names`` drawn with ``seed`` (all of them when there are no more): the same names for the same
    seed and the same mutants, whatever order they come in."""
    pool = sorted(set(names))
    if size >= len(pool):
        return pool
    return sorted(random.Random(seed).sample(pool, size))
