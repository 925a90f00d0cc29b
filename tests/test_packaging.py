"""The package metadata says what the repository holds: licence, URLs, classifiers."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def test_license_is_an_spdx_string_matching_the_license_file() -> None:
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the aiolock developers" in text
    # An SPDX expression replaces the licence classifiers (setuptools refuses both).
    assert not any(c.startswith("License ::") for c in PROJECT["classifiers"])
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if "setuptools" in r]
    match = re.fullmatch(r"setuptools>=(\d+)", setuptools)
    assert match and int(match.group(1)) >= 77, "SPDX `license` strings need setuptools 77"


def test_classifiers_match_the_package() -> None:
    classifiers = set(PROJECT["classifiers"])
    assert {"Framework :: AsyncIO", "Typing :: Typed"} <= classifiers
    assert (ROOT / "aiolock" / "py.typed").is_file()
    versions = sorted(
        int(c.rsplit(".", 1)[1])
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    minimum = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert minimum and versions and versions[0] == int(minimum.group(1))


def test_project_urls() -> None:
    urls = PROJECT["urls"]
    assert {"Homepage", "Repository", "Issues"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())
