"""The documentation: a short README that points into docs/, and a Sphinx site that builds with no warning and
documents every public name (issue 23)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from html import unescape
from pathlib import Path

import pytest

import pytest_san
from pytest_san.plugin import hookspecs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The pages issue 23 asks for (besides the generated reference), by file.
PAGES = ["getting-started", "downstream", "providers", "reports", "contract", "bad-input", "lab-hosts", "inventories",
         "lab", "lab-internals", "model", "nightly", "benchmarks", "changelog", "reference/api", "reference/hil",
         "reference/options", "reference/cli"]


def test_the_readme_is_short_and_has_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    text = "\n".join(lines)
    assert ".venv/bin/pytest --pyargs pytest_san.scenarios --san-report san-report.json" in text  # the main job
    assert ".venv/bin/pytest tests\n" in text  # the project's tests
    assert "sphinx-build -W --keep-going -b html docs docs/_build/html" in text
    assert "docs/_build/html/" in text


def test_the_readme_links_only_to_files_that_exist() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into the docs"
    assert not [t for t in local if not (ROOT / t).exists()]
    assert {f"docs/{page}.md" for page in PAGES} - {"docs/changelog.md"} <= set(local)


def test_every_page_is_in_the_toctree() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert (DOCS / f"{page}.md").is_file(), page
        assert re.search(rf"^{re.escape(page)}$", index, re.M), f"{page} is in no toctree of docs/index.md"


# The contents' four parts, in Diataxis order (issue 38 item 6): learning, tasks, looking up, understanding.
CAPTIONS = ["Tutorials", "How-to guides", "Reference", "Explanation"]


def _toctrees(index: str) -> list[tuple[str | None, list[str]]]:
    """Each toctree of a MyST page: its caption and its entries, in order."""
    trees: list[tuple[str | None, list[str]]] = []
    for body in re.findall(r"^```\{toctree\}[^\n]*\n(.*?)^```[ \t]*$", index, re.M | re.S):
        lines = [line.strip() for line in body.splitlines()]
        caption = next((line.split(":", 2)[2].strip() for line in lines if line.startswith(":caption:")), None)
        entries = [re.sub(r"^.*<(.+)>$", r"\1", line) for line in lines if line and not line.startswith(":")]
        trees.append((caption, entries))
    return trees


def _doc_pages() -> set[str]:
    """Every page of the docs but the index, by its name in a toctree (``reference/api``)."""
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")
             if not any(part.startswith("_") for part in p.relative_to(DOCS).parts)}
    return pages - {"index"}


def _contents_problems(index: str, pages: set[str]) -> list[str]:
    trees = _toctrees(index)
    captions = [caption for caption, _ in trees]
    problems = [f"the toctrees' captions are {captions}, not {CAPTIONS}"] if captions != CAPTIONS else []
    listed = Counter(entry for _, entries in trees for entry in entries)
    problems += [f"{page} is listed {n} times" for page, n in sorted(listed.items()) if n > 1]
    problems += [f"{page} is in no toctree" for page in sorted(pages - set(listed))]
    problems += [f"{page} is listed but is no page" for page in sorted(set(listed) - pages)]
    return problems


def test_the_contents_are_tutorials_how_tos_reference_and_explanation_each_page_once() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    assert _contents_problems(index, _doc_pages()) == []
    intro = index.split("```{toctree}")[0].lower()
    assert all(part in intro for part in ("tutorial", "how-to", "reference", "explanation")), "the intro names them"


def test_the_contents_check_finds_a_page_twice_missing_or_out_of_order() -> None:
    index, pages = (DOCS / "index.md").read_text(encoding="utf-8"), _doc_pages()
    assert index.rstrip().endswith("```"), "the last toctree ends the index"
    first = _toctrees(index)[0][1][0]
    twice = index.rstrip()[:-3] + f"{first}\n```\n"
    assert _contents_problems(twice, pages) == [f"{first} is listed 2 times"]
    missing = re.sub(rf"^{re.escape(first)}\n", "", index, count=1, flags=re.M)
    assert _contents_problems(missing, pages) == [f"{first} is in no toctree"]
    swap = {"Reference": "Explanation", "Explanation": "Reference"}
    swapped = re.sub(r"^:caption: (Reference|Explanation)$", lambda m: f":caption: {swap[m[1]]}", index, flags=re.M)
    assert _contents_problems(swapped, pages) == [
        f"the toctrees' captions are {[*CAPTIONS[:2], CAPTIONS[3], CAPTIONS[2]]}, not {CAPTIONS}"]
    assert _contents_problems(index, pages | {"orphan"}) == ["orphan is in no toctree"]


def test_included_documents_are_included_not_copied() -> None:
    """CONTRACT.md, the changelog and the two READMEs that ship in the wheel are each written once."""
    includes = {
        "contract": "../pytest_san/CONTRACT.md", "bad-input": "../pytest_san/CONTRACT.md",
        "changelog": "../CHANGELOG.md", "inventories": "../hil/inventory/examples/README.md",
        "lab-internals": "../hil/lab/README.md",
    }
    for page, source in includes.items():
        assert f"```{{include}} {source}" in (DOCS / f"{page}.md").read_text(encoding="utf-8"), page
    contract = (ROOT / "pytest_san" / "CONTRACT.md").read_text(encoding="utf-8")
    first_row = "| a socket that is not an open socket of that provider"
    docs = [p for p in DOCS.rglob("*.md") if first_row in p.read_text(encoding="utf-8")]
    assert contract.count(first_row) == 1 and not docs, "the bad-input table is written once, in CONTRACT.md"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for module in ("sphinx", "myst_parser", "furo", "sphinxarg"):
        pytest.importorskip(module, reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("html")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                          str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"sphinx-build failed:\n{run.stdout}\n{run.stderr}"
    assert not run.stderr.strip(), run.stderr
    return out


def _ids(html: Path) -> set[str]:
    return set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', html.read_text(encoding="utf-8")))


def test_the_docs_build_without_a_warning_and_every_page_is_there(built: Path) -> None:
    missing = [page for page in PAGES if not (built / f"{page}.html").is_file()]
    assert not missing


def test_the_api_reference_lists_every_public_name_and_hook(built: Path) -> None:
    ids = _ids(built / "reference" / "api.html")
    assert not [name for name in pytest_san.__all__ if f"pytest_san.{name}" not in ids]
    hooks = [name for name in vars(hookspecs) if name.startswith("pytest_san_")]
    assert hooks and not [h for h in hooks if f"pytest_san.plugin.hookspecs.{h}" not in ids]
    assert "pytest_san.batch.Batching" in ids and "pytest_san.batch.Batch.call" in ids
    assert "pytest_san.spi.burst.BurstProvider" in ids


def _text(html: Path) -> str:
    return unescape(re.sub(r"<[^>]+>", "", html.read_text(encoding="utf-8")))


def test_the_options_table_is_the_plugins_own(built: Path) -> None:
    """Every option and ini key pytest_addoption declares is in the table, with its help text."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import san_options
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    page = _text(built / "reference" / "options.html")
    declared = san_options.record("pytest_san.plugin.options")
    assert len(declared.options) >= 15 and declared.inis
    for names, attrs in declared.options:
        assert names[-1] in page and attrs["help"][:40] in page, names
    assert all(key in page for key in declared.inis)
    assert "--san-failures" in page  # hil.plugin.nightly's, in its own table


def test_the_cli_reference_has_every_command_and_option(built: Path) -> None:
    import argparse

    from hil.cli.main import build_parser

    page = _text(built / "reference" / "cli.html")

    def walk(parser: argparse.ArgumentParser, prog: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert f"{prog} {name}" in page, f"{prog} {name}"
                    walk(sub, f"{prog} {name}")
            for option in action.option_strings:
                assert option in page, f"{prog} {option}"

    walk(build_parser(), "san-hil")


def test_the_verbs_engine_is_documented_without_pyverbs(built: Path) -> None:
    ids = _ids(built / "reference" / "hil.html")
    assert {"hil.inventory.HostConfig", "hil.inventory.load_inventory", "hil.controller.backend.HilBackend",
            "hil.agent.engines.verbs.engine.VerbsProvider", "hil.agent.engines.verbs.process.VerbsProcess"} <= ids
