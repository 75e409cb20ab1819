"""A wheelhouse of pytest-san and its dependencies for a lab host's Python, built on the user's side.

The host needs no package index: pytest-san's own wheel is made from the code the user runs (deterministic, so
the same code gives the same digest, and the host reuses its venv), its dependencies are ``pip download``-ed for
the host's Python version and platform (``--only-binary=:all:``, pip's own index and cache), and where pip cannot
reach an index the distributions installed beside this controller stand in, when the host's Python and platform
are this machine's. The result is cached under the user's cache directory, keyed by everything it depends on.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest_san
from hil.remote_run.arguments import RunError

__all__ = ["PROBE", "HostPython", "Wheelhouse", "build_wheelhouse", "own_wheel"]

ROOT = Path(pytest_san.__file__).resolve().parents[1]  # where pytest_san/ and hil/ sit side by side
PACKAGES = ("pytest_san", "hil")
NOT_SHIPPED_SUFFIXES = (".pyc", ".pyo", ".o", ".ko", ".cmd", ".mod", ".order", ".symvers")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member's date: the same code makes the same wheel, byte for byte
EXTRAS = ("hil",)  # the remote controller reaches the host's peers over SSH, and reads YAML inventories
MIN_HOST_PYTHON = (3, 10)  # pyproject.toml's requires-python, for the controller that runs on the host
PIP_TIMEOUT = 900.0

# What the host's Python says of itself (any python3, standard library only): one line of JSON.
PROBE = (
    "import json, platform, sys; from importlib.util import find_spec; libc = platform.libc_ver(); "
    "print(json.dumps({'version': list(sys.version_info[:2]), 'implementation': sys.implementation.name, "
    "'machine': platform.machine(), 'libc': libc[0], 'libc_version': libc[1], 'executable': sys.executable, "
    "'venv': find_spec('venv') is not None}))"
)


@dataclass(frozen=True)
class HostPython:
    """A host's Python, as :data:`PROBE` reports it; ``check`` says why it cannot run the controller."""

    version: tuple[int, int]
    implementation: str  # "cpython"
    machine: str  # "x86_64", "aarch64"
    libc: str  # "glibc", or "" (musl, unknown)
    libc_version: str  # "2.36"
    executable: str
    has_venv: bool

    @classmethod
    def from_probe(cls, text: str) -> HostPython:
        data = json.loads(text.strip().splitlines()[-1])
        major, minor = data["version"]
        return cls((int(major), int(minor)), str(data["implementation"]), str(data["machine"]), str(data["libc"]),
                   str(data["libc_version"]), str(data["executable"]), bool(data["venv"]))

    @classmethod
    def here(cls) -> HostPython:
        libc = platform.libc_ver()
        return cls((sys.version_info[0], sys.version_info[1]), sys.implementation.name, platform.machine(),
                   libc[0], libc[1], sys.executable, True)

    def check(self) -> str | None:
        """Why this Python cannot run pytest-san's controller, or None."""
        shown = ".".join(map(str, self.version))
        if self.version < MIN_HOST_PYTHON:
            need = ".".join(map(str, MIN_HOST_PYTHON))
            return f"its Python ({self.executable}) is {shown}: the controller needs {need} or later"
        if self.implementation != "cpython":
            return f"its Python ({self.executable}) is {self.implementation}: wheels are built for CPython"
        if not self.has_venv:
            return f"its Python ({self.executable}) has no venv module (Debian: apt-get install python3-venv)"
        return None

    @property
    def tag(self) -> str:
        return f"cp{self.version[0]}{self.version[1]}"

    def platforms(self) -> list[str]:
        """pip's --platform values for this host, newest first (pip does not widen manylinux_2_X on its own)."""
        arch = self.machine
        found = re.fullmatch(r"(\d+)\.(\d+)", self.libc_version)
        tags: list[str] = []
        if self.libc == "glibc" and found and int(found.group(1)) == 2:
            for minor in range(int(found.group(2)), 4, -1):
                tags.append(f"manylinux_2_{minor}_{arch}")
                legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(minor)
                if legacy:
                    tags.append(f"{legacy}_{arch}")
        tags.append(f"linux_{arch}")
        return tags

    def pip_target(self) -> list[str]:
        """pip download's options that choose wheels for this Python and platform."""
        options = ["--only-binary=:all:", "--python-version", f"{self.version[0]}.{self.version[1]}",
                   "--implementation", "cp", "--abi", self.tag]
        for tag in self.platforms():
            options += ["--platform", tag]
        return options

    def same_as(self, other: HostPython) -> bool:
        return (self.version, self.implementation, self.machine, self.libc) == (
            other.version, other.implementation, other.machine, other.libc)


@dataclass(frozen=True)
class Wheelhouse:
    """The wheels for one host Python, by file name; ``how`` says where they came from (for the log)."""

    wheels: dict[str, bytes]
    how: str


# --- pytest-san's own wheel --------------------------------------------------------------------------------


def own_wheel() -> tuple[str, bytes]:
    """(file name, content) of a wheel of the pytest-san this process runs: its files as they are now."""
    version = pytest_san.__version__
    dist_info = f"pytest_san-{version}.dist-info"
    entries: list[tuple[str, bytes]] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(NOT_SHIPPED_SUFFIXES):
                entries.append((path.relative_to(ROOT).as_posix(), path.read_bytes()))
    entries += [
        (f"{dist_info}/METADATA", _metadata(version).encode()),
        (f"{dist_info}/entry_points.txt", _entry_points().encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: san-hil run\nRoot-Is-Purelib: true\n"
                               b"Tag: py3-none-any\n"),
    ]
    return f"pytest_san-{version}-py3-none-any.whl", _zip(entries, f"{dist_info}/RECORD")


def _distribution() -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution("pytest-san")
    except importlib.metadata.PackageNotFoundError:
        raise RunError("pytest-san is not installed here (no metadata for it): pip install it, or "
                       "pip install -e . in its checkout, to run it remotely") from None


def _metadata(version: str) -> str:
    dist = _distribution()
    lines = ["Metadata-Version: 2.1", "Name: pytest-san", f"Version: {version}"]
    lines += [f"Requires-Python: {spec}" for spec in dist.metadata.get_all("Requires-Python") or []]
    extras = dist.metadata.get_all("Provides-Extra") or []
    lines += [f"Provides-Extra: {extra}" for extra in extras]
    lines += [f"Requires-Dist: {requirement}" for requirement in dist.requires or []]
    return "\n".join(lines) + "\n"


def _entry_points() -> str:
    text = _distribution().read_text("entry_points.txt")
    if not text:
        raise RunError("pytest-san's installed metadata has no entry points (its pytest plugin): reinstall it")
    return text


def _zip(entries: Sequence[tuple[str, bytes]], record: str) -> bytes:
    """A wheel's zip of ``entries`` and their RECORD, every member dated ZIP_TIME."""
    lines = []
    for name, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    lines.append(f"{record},,")
    path = Path(tempfile.mkstemp(suffix=".whl")[1])
    try:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in [*entries, (record, ("\n".join(lines) + "\n").encode())]:
                info = zipfile.ZipInfo(name, ZIP_TIME)
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, data)
        return path.read_bytes()
    finally:
        path.unlink()


# --- the wheelhouse ----------------------------------------------------------------------------------------


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-san" / "wheelhouses"


def build_wheelhouse(target: HostPython, requirements: Sequence[str] = (), cache: Path | None = None) -> Wheelhouse:
    """The wheels for ``target``: pytest-san (with its hil extra), ``requirements`` and their dependencies, and
    pip (the host's venv is made without one, and filled by this pip)."""
    name, own = own_wheel()
    cache = cache_root() if cache is None else cache
    wanted = sorted(requirements)
    key_text = json.dumps([hashlib.sha256(own).hexdigest(), target.pip_target(), wanted])
    where = cache / hashlib.sha256(key_text.encode()).hexdigest()[:20]
    if (where / ".complete").is_file():
        return Wheelhouse(_read(where), f"cached in {where}")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache))
    try:
        source = staging / "own"
        source.mkdir()
        (source / name).write_bytes(own)
        wheels = staging / "wheels"
        wheels.mkdir()
        extras = ",".join(EXTRAS)
        specs = [f"pytest-san[{extras}] @ {(source / name).as_uri()}", *wanted, "pip"]
        failure = _pip_download(specs, target, wheels)
        how = "pip download"
        if failure is not None:
            if not target.same_as(HostPython.here()):
                raise RunError(f"cannot build the wheelhouse for the host's Python {target.tag} "
                               f"({', '.join(target.platforms()[:1])}): pip download failed: {failure}")
            _from_installed(list(_wanted_distributions(wanted)), wheels)
            (wheels / name).write_bytes(own)
            how = f"this controller's own site-packages (pip download failed: {failure})"
        (wheels / ".complete").write_text(how + "\n")
        try:
            wheels.rename(where)
        except OSError:  # another run put the same wheelhouse in place first
            if not (where / ".complete").is_file():
                raise
        return Wheelhouse(_read(where), how)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _read(where: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(where.glob("*.whl"))}


def _pip_download(specs: Sequence[str], target: HostPython, dest: Path) -> str | None:
    """Download ``specs`` and their dependencies for ``target`` into ``dest``: None, or why it failed."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--dest", str(dest), *target.pip_target(), *specs]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
    return (errors[-1] if errors else f"exit status {done.returncode}").strip()


def _wanted_distributions(requirements: Sequence[str]) -> Iterator[importlib.metadata.Distribution]:
    """The installed distributions pytest-san[hil], ``requirements`` and pip need here, dependencies included."""
    from packaging.requirements import Requirement  # pytest's own dependency

    pending = [Requirement(r) for r in _distribution().requires or []]
    pending = [r for r in pending if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *EXTRAS))]
    for requirement in pending:
        requirement.marker = None  # chosen: pytest-san's own and its extras' (evaluated here, for this Python)
    pending += [Requirement(r) for r in [*requirements, "pip"]]
    seen: set[str] = set()
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if key in seen or key == "pytest-san":
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            raise RunError(f"cannot build the wheelhouse: pip download failed and {requirement.name} is not "
                           "installed here either") from None
        yield dist
        for text in dist.requires or []:
            nested = Requirement(text)
            if nested.marker is None or any(nested.marker.evaluate({"extra": e})
                                            for e in ("", *requirement.extras)):
                nested.marker = None
                pending.append(nested)


def _from_installed(dists: Sequence[importlib.metadata.Distribution], dest: Path) -> None:
    """A wheel of each installed distribution, from the files its RECORD lists (its own WHEEL's tags)."""
    for dist in dists:
        files = [f for f in dist.files or [] if f.parts[0] != ".." and "__pycache__" not in f.parts
                 and not str(f).endswith((".pyc", "RECORD", "INSTALLER", "REQUESTED", "direct_url.json"))]
        info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
        if info is None:
            raise RunError(f"cannot build the wheelhouse: {dist.metadata['Name']} is installed without a "
                           ".dist-info (an egg or an editable install) and pip download failed")
        wheel_text = dist.read_text("WHEEL") or ""
        tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
        entries = [(str(f.as_posix()), Path(str(f.locate())).read_bytes()) for f in files]
        parts = [tag.split("-") for tag in tags if tag.count("-") == 2] or [["py3", "none", "any"]]
        python, abi, plat = (".".join(sorted({p[i] for p in parts})) for i in range(3))
        name = info[: -len(".dist-info")]
        (dest / f"{name}-{python}-{abi}-{plat}.whl").write_bytes(_zip(entries, f"{info}/RECORD"))
