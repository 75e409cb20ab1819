"""Pages opened as a person opens them: Debian's headless Chromium renders them (scripts run), and the tests read
the rendered DOM or look at a screenshot.

Chromium runs with a fresh profile per call and without its background traffic (on a closed network its
updates, sync and component checks only fail); each call waits for the page's load, then exits.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

REQUIRE = "SAN_REQUIRE_CHROMIUM"  # set (CI's browser stage): no Chromium is a failure, not a skip
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def chromium() -> str:
    """The Chromium binary; the test is skipped (or, with SAN_REQUIRE_CHROMIUM set, fails) without one."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "no chromium on PATH: apt-get install chromium"
        if os.environ.get(REQUIRE):
            pytest.fail(f"{REQUIRE} is set and {message}")
        pytest.skip(message)
    return found


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="san-chromium-") as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def dump_dom(page: Path, timeout: float = 120) -> str:
    """The DOM of ``page`` once loaded and its scripts ran (``--dump-dom``)."""
    done = _run(["--virtual-time-budget=10000", "--dump-dom", page.resolve().as_uri()], timeout)
    assert done.returncode == 0 and "<html" in done.stdout, f"chromium --dump-dom {page}: {done.stderr[-2000:]}"
    return done.stdout


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 1600, timeout: float = 120) -> Path:
    """A PNG of ``page`` as rendered in a window of ``width`` x ``height``."""
    png.parent.mkdir(parents=True, exist_ok=True)
    done = _run([f"--window-size={width},{height}", "--virtual-time-budget=10000", f"--screenshot={png.resolve()}",
                 page.resolve().as_uri()], timeout)
    assert done.returncode == 0 and png.is_file(), f"chromium --screenshot {page}: {done.stderr[-2000:]}"
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    return png


def artifacts(default: Path) -> Path:
    """Where screenshots are kept: $SAN_ARTIFACTS (CI's artifact folder) or ``default``."""
    path = Path(os.environ.get("SAN_ARTIFACTS") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclasses.dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] = dataclasses.field(default_factory=list)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def find_all(self, tag: str, **attrs: str) -> list[Element]:
        """Descendants with that tag whose attributes have those values (``class_`` matches one class)."""
        found = []
        for child in self.children:
            wanted = all((value in child.classes()) if key == "class_" else child.attrs.get(key.replace("_", "-"))
                         == value for key, value in attrs.items())
            if child.tag == tag and wanted:
                found.append(child)
            found += child.find_all(tag, **attrs)
        return found

    def find(self, tag: str, **attrs: str) -> Element:
        found = self.find_all(tag, **attrs)
        assert found, f"no <{tag}> with {attrs} in the page"
        return found[0]


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):  # close up to the matching element (lenient, as browsers)
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        for element in self.stack[1:]:
            element.text += data


def parse(html: str) -> Element:
    """The page as a tree of elements; each element's ``text`` is all the text inside it."""
    tree = _Tree()
    tree.feed(html)
    tree.close()
    return tree.root
