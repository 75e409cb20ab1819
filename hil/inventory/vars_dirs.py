"""``group_vars/`` and ``host_vars/`` beside an inventory file, found as Ansible's ``host_group_vars`` plugin
finds them.

For a group (or host) NAME: ``NAME``, ``NAME.yml``, ``NAME.yaml`` or ``NAME.json``, a YAML (or JSON) mapping
of variables; or a directory ``NAME/`` of such files (no extension, ``.yml``, ``.yaml``, ``.json``; hidden
files and ``backup~`` files skipped, subdirectories without an extension followed) read in lexical order,
a later file's key beating an earlier one's. Ansible reads the first of those names that exists and
ignores the others silently; two of them is an error here. Files for groups or hosts the inventory does
not have are not read, as in Ansible (one directory may serve several inventories). PyYAML is imported
only when there is a file to read.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from hil.inventory.keys import parse_vars
from hil.inventory.model import Source
from hil.inventory.tree import GroupTree, Vars
from hil.inventory.yaml_inventory import load_yaml

__all__ = ["read_vars_dirs"]

_EXTENSIONS = ("", ".yml", ".yaml", ".json")  # in the order Ansible tries them


def read_vars_dirs(tree: GroupTree, inventory: Path) -> None:
    """Add the variables of ``group_vars/`` and ``host_vars/`` beside ``inventory`` to ``tree``'s layers."""
    for kind, what, names, layer in (
        ("group_vars", "group", list(tree.children), tree.file_group_vars),
        ("host_vars", "host", list(tree.host_vars), tree.file_host_vars),
    ):
        directory = inventory.parent / kind
        if not _exists(directory, tree.src, dir_only=True):
            continue
        for name in names:
            variables: Vars = {}
            for path in _files(directory, name, tree.src, what):
                src = Source(str(path), tree.src.base, tree.src.check_files)  # paths still relative to the inventory
                variables.update(parse_vars(_load(path, src), src, f"{what} {name!r}"))
            if variables:
                layer[name] = variables


def _exists(path: Path, src: Source, *, dir_only: bool = False) -> bool:
    try:
        return path.is_dir() if dir_only else path.exists()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # a name no file can have
            return False
        raise src.error(f"cannot check {str(path)!r}: {exc.strerror or exc}") from None


def _files(directory: Path, name: str, src: Source, what: str) -> list[Path]:
    if "/" in name or name in (".", "..") or "\0" in name:  # a name that is no file name has no file
        return []
    found = [directory / (name + ext) for ext in _EXTENSIONS if _exists(directory / (name + ext), src)]
    if len(found) > 1:
        raise Source(str(found[1]), src.base, src.check_files).error(
            f"{what} {name!r}", f"{found[0]} exists too, and Ansible would read only that one: keep one of them")
    if not found:
        return []
    if found[0].is_dir():
        return _directory_files(found[0], src, set())
    return found


def _directory_files(directory: Path, src: Source, seen: set[Path]) -> list[Path]:
    real = directory.resolve()
    if real in seen:  # a symbolic link back up the tree
        return []
    seen.add(real)
    try:
        entries = sorted(os.listdir(directory))
    except OSError as exc:
        raise Source(str(directory), src.base, src.check_files).error(
            f"cannot list the directory: {exc.strerror or exc}") from None
    out: list[Path] = []
    for entry in entries:
        if entry.startswith(".") or entry.endswith("~"):  # hidden and backup files, as Ansible skips them
            continue
        path = directory / entry
        extension = os.path.splitext(entry)[1]
        if path.is_dir() and not extension:
            out += _directory_files(path, src, seen)
        elif path.is_file() and extension in _EXTENSIONS:
            out.append(path)
    return out


def _load(path: Path, src: Source) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise src.error(f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise src.error(f"cannot read: {exc.strerror or exc}") from None
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        raise src.error("encrypted with ansible-vault, which pytest-san does not decrypt: the variables it reads "
                        "hold no secrets (passwords are refused), so write them in plain text")
    return load_yaml(text, src)
