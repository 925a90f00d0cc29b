"""Every Python block in ``docs/`` and ``README.md`` runs, or says on purpose why not.

The convention (docs/writing-docs.md): an HTML comment on the line before a
fenced block says what it is, and renders as nothing on GitHub and in the site.

* no marker: a whole program. It is run here against a real server, with
  ``$REDIS_URL`` pointing at it; an exception (a renamed argument, a changed
  signature) fails the test.
* ``<!-- output -->`` before a ``text`` block: what the runnable block before
  it prints, compared line by line (``...`` matches anything, as in doctest).
* ``<!-- fragment -->``: a piece of a program (names defined elsewhere, a
  placeholder server address); it must still parse, and every ``aiolock.X``
  or ``client.x(`` it names must exist.
* ``<!-- tested-by: tests/test_x.py -->``: run by that test file (it needs a
  Cluster, Sentinel or several masters), which must name the page; or the
  block includes a whole file (``--8<-- "examples/worker.py"``) that test runs.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import aiolock
from tests.conftest import _server_params

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*(fragment|output|tested-by:\s*(\S+))\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    code: str
    marker: str  # "", "fragment", "output", "tested-by"
    tested_by: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    text = page.read_text()
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, match.start()) + 1
        found = MARKER.search(before)
        marker = "" if not found else found[1].split(":")[0]
        yield Block(page, line, match[1], match[2], marker, found[2] or "" if found else "")


ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.lang == "python"]
RUNNABLE = [b for b in PYTHON if not b.marker]


def test_every_marker_is_used_as_documented() -> None:
    for block in ALL:
        if block.marker == "output":
            assert block.lang == "text", f"{block.id}: an output block is ```text"
            previous = [b for b in RUNNABLE if b.page == block.page and b.line < block.line]
            assert previous, f"{block.id}: no runnable block before this output"
        elif block.marker:
            assert block.lang == "python", f"{block.id}: a {block.marker} marker on ```{block.lang}"
    assert len(RUNNABLE) >= 10, "the guides' programs are run"


def run(block: Block, url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("REDIS_URL", url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.id, "exec"), {"__name__": "__main__"})
    return out.getvalue()


@pytest.mark.parametrize("server", _server_params()[:1], indirect=True)  # one backend: lean
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_the_sample_runs_and_prints_what_the_page_says(
    block: Block, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = run(block, url, monkeypatch)
    outputs = [
        b for b in ALL if b.page == block.page and b.marker == "output" and b.line > block.line
    ]
    following = [b for b in RUNNABLE if b.page == block.page and b.line > block.line]
    if outputs and (not following or outputs[0].line < following[0].line):
        checker = doctest.OutputChecker()
        assert checker.check_output(outputs[0].code, printed, doctest.ELLIPSIS), (
            f"{block.id} printed:\n{printed}\nthe page says:\n{outputs[0].code}"
        )


@pytest.mark.parametrize("block", [b for b in PYTHON if b.marker == "fragment"], ids=lambda b: b.id)
def test_a_fragment_parses_and_names_what_exists(block: Block) -> None:
    tree = compile(block.code, block.id, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert isinstance(tree, ast.Module)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "aiolock"
        ):
            assert hasattr(aiolock, node.attr), f"{block.id}: aiolock.{node.attr}"
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "client"
            and not node.attr.startswith("_")
        ):
            assert hasattr(aiolock.Client, node.attr), f"{block.id}: client.{node.attr}"


@pytest.mark.parametrize(
    "block", [b for b in PYTHON if b.marker == "tested-by"], ids=lambda b: b.id
)
def test_a_sample_run_elsewhere_is_run_there(block: Block) -> None:
    test_file = ROOT / block.tested_by
    assert test_file.is_file(), f"{block.id}: {block.tested_by} does not exist"
    page = block.page.relative_to(ROOT).as_posix()
    included = re.fullmatch(r'--8<-- "([^"]+)"\s*', block.code)
    if included:  # the block is a file, included whole: the test runs that file
        assert (ROOT / included[1]).is_file(), included[1]
        assert Path(included[1]).name in test_file.read_text(), block.tested_by
    else:
        assert page in test_file.read_text(), f"{block.tested_by} does not read {page}"


def test_the_reference_lists_the_public_names() -> None:
    pages = "".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    listed = re.findall(r"^::: aiolock\.(\w+)$", pages, re.M)
    assert sorted(listed) == sorted(aiolock.__all__)


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "the README is a front page: details go to docs/"
    assert "python -m pip install -e '.[docs]' && mkdocs serve" in readme
    for target in re.findall(r"\]\((docs/[^)#]*)", readme):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages <= set(re.findall(r"([\w/.-]+\.md)", nav)), "a page missing from the nav"
