"""What the installed distribution says about itself: one version, the metadata, and (when installed from a
wheel, as tox and .ci/run install it) the package data the documentation tells users to read or run."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

import pytest_san

DIST = "pytest-san"

# Files the README, the contract and the lab's README point installed users at.
PACKAGE_DATA = (
    "pytest_san/CONTRACT.md",
    "pytest_san/py.typed",
    "pytest_san/examples/broken_provider.py",
    "hil/py.typed",
    "hil/inventory/examples/README.md",
    "hil/inventory/examples/lab.yaml",
    "hil/inventory/examples/local.yaml",
    "hil/inventory/examples/ini/lab.ini",
    "hil/inventory/examples/ini/group_vars/all.yml",
    "hil/inventory/examples/ini/group_vars/san.yml",
    "hil/lab/README.md",
    "hil/lab/install.sh",
    "hil/lab/guest-init.sh",
    "hil/kmod/san_proxy.c",  # san_proxy.ko's sources: `lab up` builds them, a host runs `make -C` on them
    "hil/kmod/san_proxy.h",
    "hil/kmod/Kbuild",
    "hil/kmod/Makefile",
)


def installed() -> importlib.metadata.Distribution:
    """The installed distribution (pip wrote INSTALLER), not a build's pytest_san.egg-info in the checkout,
    which the checkout on sys.path would show first."""
    for dist in importlib.metadata.distributions(name=DIST):
        if dist.read_text("INSTALLER") is not None:
            return dist
    pytest.fail(f"{DIST} is not installed (pip install -e '.[test]')")


def test_the_version_is_written_once() -> None:
    assert installed().version == pytest_san.__version__


def test_the_metadata_is_complete() -> None:
    meta = installed().metadata
    assert meta["License-Expression"] == "MIT"
    assert meta["Author"] == "pytest-san developers" or "pytest-san developers" in (meta["Author-email"] or "")
    assert meta["Keywords"] and meta["Description-Content-Type"] == "text/markdown"
    assert "# pytest-san" in (meta.get_payload() or meta["Description"] or "")  # the README, as the body
    classifiers = set(meta.get_all("Classifier") or [])
    pythons = {f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13)}
    assert {"Framework :: Pytest", *pythons} <= classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Source", "Issues", "Contract", "Changelog"} <= set(urls)


def test_the_wheel_carries_what_the_docs_tell_users_to_run() -> None:
    dist = installed()
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("dir_info", {}).get("editable"):
        pytest.skip("an editable install has no wheel to look into (tox and .ci/run install the built wheel)")
    files = {f.as_posix() for f in dist.files or []}
    missing = [name for name in PACKAGE_DATA if name not in files]
    assert not missing, f"the installed wheel lacks {missing}"
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files)
