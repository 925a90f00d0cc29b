"""MkDocs hooks (mkdocs.yml ``hooks:``): the pages that live outside ``docs/``.

* ``architecture.md`` is generated from the repository's ``ARCHITECTURE.md``
  (one source, the one contributors read on GitHub).
* The benchmark plots (``benchmarks/*.png``) are served under ``assets/benchmarks/``.
* Sphinx roles left in docstrings (``:class:`Lease```) are shown as plain code.
* A link in a page to a repository file outside ``docs/`` (``examples/worker.py``,
  ``benchmarks/RESULTS.md``) becomes the file's path in code: the site does not
  publish the repository, and ``--strict`` would otherwise fail on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(!?)\[([^\]]+)\]\((?!https?:|mailto:|#)([^)#\s]+)(#[^)\s]*)?\)")


def on_files(files: Files, config: Any) -> Files:
    architecture = (ROOT / "ARCHITECTURE.md").read_text()
    files.append(File.generated(config, "architecture.md", content=architecture))
    for png in sorted((ROOT / "benchmarks").glob("*.png")):
        files.append(File.generated(config, f"assets/benchmarks/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    here = Path(config["docs_dir"]) / page.file.src_uri

    def rewrite(match: re.Match[str]) -> str:
        bang, text, target, _anchor = match.groups()
        if bang or (here.parent / target).exists() or files.get_file_from_path(target):
            return match[0]
        outside = (ROOT / target).resolve()
        docs = Path(config["docs_dir"]).resolve()
        if outside.is_relative_to(docs) and outside.exists():  # ARCHITECTURE.md -> docs/...
            page_dir = (docs / page.file.src_uri).parent
            relative = Path(*[".."] * len(page_dir.relative_to(docs).parts))
            link = (relative / outside.relative_to(docs)).as_posix() + (_anchor or "")
            return f"[{text}]({link})"
        if outside.is_relative_to(ROOT) and outside.exists():
            path = outside.relative_to(ROOT).as_posix()
            return text if path in text else f"{text} (`{path}`)"
        return match[0]  # a broken link: --strict reports it

    return LINK.sub(rewrite, markdown)


ROLE = re.compile(r":(?:class|meth|func|attr|exc|data|mod|obj):(?=<code>)")


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Docstrings written for Sphinx (``:class:`Lease```) read as plain code here."""
    return ROLE.sub("", html)
