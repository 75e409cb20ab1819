"""What .ci/run requires of the built distribution: check_dist.py WHEEL SDIST.

The wheel must carry what the documentation tells installed users to read or run (the package data), the
sdist what it takes to run the tests from the unpacked archive. Prints what each holds.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile

WHEEL_NEEDS = [
    "pytest_san/CONTRACT.md", "pytest_san/py.typed", "pytest_san/examples/broken_provider.py", "hil/py.typed",
    "hil/inventory/examples/README.md", "hil/inventory/examples/lab.yaml", "hil/inventory/examples/local.yaml",
    "hil/inventory/examples/ini/lab.ini", "hil/inventory/examples/ini/group_vars/all.yml",
    "hil/inventory/examples/ini/group_vars/san.yml",
    "hil/lab/README.md", "hil/lab/install.sh", "hil/lab/guest-init.sh",
]
SDIST_NEEDS = [
    "LICENSE", "README.md", "CHANGELOG.md", "MANIFEST.in", "tox.ini", "pyproject.toml", "pytest_san/CONTRACT.md",
    "tests/conftest.py", "tests/support/__init__.py", "tests/support/downstream_example.py", "tests/support/sshd.py",
    "tests/pytest_san/examples/test_examples.py", "tests/pytest_san/test_contract_doc.py", "docs/conf.py",
    "docs/index.md", "docs/model.md",
]


def main(wheel: str, sdist: str) -> int:
    names = zipfile.ZipFile(wheel).namelist()
    missing = [f"wheel: {n}" for n in WHEEL_NEEDS if n not in names]
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        missing.append("wheel: LICENSE")
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
    root = members[0].split("/")[0]
    missing += [f"sdist: {n}" for n in SDIST_NEEDS if f"{root}/{n}" not in members]
    stray = [m for m in members + names if "__pycache__" in m or m.endswith((".pyc", ".pyo"))]
    if stray:
        missing.append(f"no bytecode, but found {stray[:5]} ({len(stray)} in all)")
    if missing:
        print(f"ci: the distribution lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    data = sorted(n for n in names if not n.endswith(".py") and ".dist-info/" not in n)
    tests = [m for m in members if m.startswith(f"{root}/tests/") and m.endswith(".py")]
    print(f"ci: wheel: {len(names)} files; package data: {', '.join(data)}")
    print(f"ci: sdist: {len(members)} entries, {len(tests)} of them tests/*.py (conftest.py and support/ included)")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
