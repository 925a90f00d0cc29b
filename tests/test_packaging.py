"""The package metadata says what the repository holds: licence, URLs, classifiers.

And what an install gives: the wheel holds the package with its Lua scripts and
``py.typed``, the console script, the extras and the licence; the README's
``pip install -e .`` gives type checkers the package (mypy --strict on a user's
module outside the repository, in a venv that has only what the install gave).
"""

from __future__ import annotations

import email
import os
import re
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from tests.core_util import mypy_strict

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
    assert PYPROJECT["build-system"]["build-backend"] == "hatchling.build"
    (hatchling,) = PYPROJECT["build-system"]["requires"]
    match = re.fullmatch(r"hatchling>=1\.(\d+)", hatchling)
    assert match and int(match.group(1)) >= 27, "SPDX `license` strings need hatchling 1.27"


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


def _pip(*args: str | Path, timeout: float = 120) -> None:
    """This environment's pip (pip >= 22.3 for ``--python``), quiet unless it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"pip {args} exited {done.returncode}\n{done.stdout}{done.stderr}"


def test_wheel_ships_the_package_scripts_typing_marker_entry_point_extras(tmp_path: Path) -> None:
    _pip("wheel", ROOT, "--no-deps", "--wheel-dir", tmp_path)
    (wheel,) = tmp_path.glob("aiolock-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"aiolock-{PROJECT['version']}.dist-info"
        metadata = email.message_from_string(archive.read(f"{info}/METADATA").decode())
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        licence = archive.read(f"{info}/licenses/LICENSE").decode()
    package = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "aiolock").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {"aiolock/py.typed", "aiolock/cli/__init__.py", "aiolock/_core/engine.py"} <= package
    lua = {name for name in package if name.startswith("aiolock/scripts/")}
    assert lua and all(name.endswith(".lua") for name in lua)
    # Every file of the package (the Lua scripts and py.typed too), nothing else
    # (no tests/, benchmarks/, examples/, tools/).
    assert {n for n in names if not n.startswith(f"{info}/")} == package
    assert licence == (ROOT / "LICENSE").read_text()
    assert "[console_scripts]\naiolock = aiolock.cli:main" in entry_points
    assert metadata["Name"] == "aiolock"
    assert metadata["Version"] == PROJECT["version"]
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Requires-Python"] == PROJECT["requires-python"]
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert metadata.get_payload() == (ROOT / "README.md").read_text()
    extras = PROJECT["optional-dependencies"]
    assert set(metadata.get_all("Provides-Extra")) == set(extras)
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    base = {str(r) for r in requires if r.marker is None or "extra" not in str(r.marker)}
    assert base == set(PROJECT["dependencies"])
    for extra, wanted in extras.items():
        got = {r.name for r in requires if r.marker and r.marker.evaluate({"extra": extra})}
        # `dev` names aiolock[test]: the wheel lists what that means
        names_wanted = {Requirement(w).name for w in wanted} - {"aiolock"}
        assert names_wanted <= got, (extra, got)


# A user's module, outside the repository: right and wrong uses of typed API.
USER = """
from __future__ import annotations

import aiolock


async def main(client: aiolock.Client) -> None:
    lock = client.lock("job")
    lease = await lock.acquire(timeout=1.0)
    token: int = lease.fencing_token
    await lock.release()
    maybe = await lock.try_acquire()
    maybe.fencing_token  # E: union-attr
    name: int = lock.name  # E: assignment
    client.lock(b"job")  # E: arg-type
    print(token, name)
"""

_ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def test_type_checkers_see_the_package_after_the_readme_editable_install(tmp_path: Path) -> None:
    # A venv with nothing in it but what `pip install -e .` gives (no pip, no
    # dependencies: mypy does not check installed packages' own imports).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    python = venv / "bin" / "python"
    # The README's command, run by this environment's pip for that venv; the
    # build backend comes from the index, as for a user.
    _pip("--python", python, "install", "--no-deps", "--editable", ROOT)
    user = tmp_path / "elsewhere" / "user.py"
    user.parent.mkdir()
    user.write_text(textwrap.dedent(USER))
    (user.parent / "mypy.ini").write_text("[mypy]\n")  # not the project's configuration
    done = subprocess.run(
        mypy_strict("mypy.ini", tmp_path / "mypy_cache", "user.py", python=python),
        cwd=user.parent,
        # Only what the venv gives: no MYPYPATH, no PYTHONPATH to the checkout.
        env={k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")},
        capture_output=True,
        text=True,
        timeout=100,
    )
    report = f"mypy exited {done.returncode}\n{done.stdout}{done.stderr}"
    errors = set()
    for line in done.stdout.splitlines():
        if m := _ERROR.match(line):
            errors.add((int(m["line"]), m["code"]))
        else:
            assert ": note: " in line, report
    expected = {
        (number, m.group(1))
        for number, line in enumerate(textwrap.dedent(USER).splitlines(), 1)
        if (m := re.search(r"# E: ([a-z-]+)$", line))
    }
    assert errors == expected, report
    assert done.returncode == 1, report
