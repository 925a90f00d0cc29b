"""aiolock's scripts as one Redis Functions library (``scripting="functions"``).

Every operation script (scripts.py: its ``--@include`` snippets already
expanded, the cluster text once a cluster is found) becomes one function of a
single library::

    #!lua name=aiolock_0_1_0_<digest>
    redis.register_function{function_name='aiolock_0_1_0_<digest>_acquire',
      callback=function(KEYS, ARGV) <the script's text> end, flags={...}}

* **Versioned names.** Function names are global on a server, not per
  library, so both the library and each function carry the package version
  and a digest of the library's text: two versions of aiolock (or a standalone
  and a cluster text) on one server each have their own library, and a
  library is never replaced (``FUNCTION LOAD`` without ``REPLACE``; "already
  exists" is success) nor deleted by aiolock.
* **Flags.** A script's ``#!lua flags=...`` line (the cluster's
  ``allow-cross-slot-keys``) becomes the function's ``flags``; a script whose
  header says ``--@runner no-writes`` (it only reads) is flagged
  ``no-writes``, so it runs while the server is out of memory, as its EVAL
  form does; one that frees or keeps a hold (a release, a renewal: ``--@runner
  allow-oom``) is flagged ``allow-oom``, for the same reason. Every other
  function is refused as a whole under OOM (an EVAL script is refused at its
  first write that adds memory, before it wrote anything).
* **Globals.** A function may create no global, as an EVAL script may not
  either; ``KEYS`` and ``ARGV`` are the callback's parameters.

How the library is loaded and its functions called is the runner's
(runner.py); this module only writes the text.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import metadata

from .scripts import ALLOW_OOM, NO_WRITES, NODE, Script

__all__ = ["VERSION", "LibraryText", "function_name", "library_text"]


def _version() -> str:
    try:
        return metadata.version("aiolock")
    except metadata.PackageNotFoundError:  # (run from a source tree)
        return "0"


#: The version in the library's name: the installed package's (a test gives another).
VERSION = _version()

_SHEBANG = re.compile(r"^#!lua(?P<rest>[^\n]*)\n")
_FLAGS = re.compile(r"\bflags=(?P<flags>[\w,-]+)")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


class LibraryText:
    """The library's name, its text (what ``FUNCTION LOAD`` is given) and
    each script's function name."""

    __slots__ = ("functions", "name", "source")

    def __init__(self, name: str, source: str, functions: dict[str, str]) -> None:
        self.name = name
        self.source = source
        self.functions = functions


def function_name(library: str, script: str) -> str:
    """The function of ``script`` in ``library`` (``renew@node``: ``renew__node``)."""
    return f"{library}_{_UNSAFE.sub('_', script.replace(NODE, '__node'))}"


def _split(script: Script) -> tuple[list[str], str]:
    """A script's flags (its shebang's, ``no-writes`` if it only reads) and its body."""
    flags: list[str] = []
    body = script.source
    shebang = _SHEBANG.match(body)
    if shebang is not None:
        found = _FLAGS.search(shebang["rest"])
        if found is not None:
            flags = [f for f in found["flags"].split(",") if f]
        body = body[shebang.end() :]
    base = script.name.split("@", 1)[0]
    for tag, tagged in (("no-writes", NO_WRITES), ("allow-oom", ALLOW_OOM)):
        if base in tagged and tag not in flags:
            flags.append(tag)
    return flags, body


def library_text(scripts: dict[str, Script], version: str | None = None) -> LibraryText:
    """The library of ``scripts`` for aiolock ``version`` (default: ``VERSION``)."""
    key = tuple(sorted((name, s.source) for name, s in scripts.items()))
    return _library(key, VERSION if version is None else version)


@functools.cache
def _library(scripts: tuple[tuple[str, str], ...], version: str) -> LibraryText:
    parts = [(name, *_split(Script(name, source, ""))) for name, source in scripts]
    digest = hashlib.sha1(version.encode())
    for name, flags, body in parts:
        digest.update(f"\0{name}\0{','.join(flags)}\0{body}".encode())
    library = f"aiolock_{_UNSAFE.sub('_', version)}_{digest.hexdigest()[:12]}"
    functions = {name: function_name(library, name) for name, _, _ in parts}
    lines = [f"#!lua name={library}"]
    for name, flags, body in parts:
        shown = ", ".join(f"'{f}'" for f in flags)
        lines.append(
            f"redis.register_function{{function_name='{functions[name]}', "
            f"callback=function(KEYS, ARGV)\n{body}\nend, flags={{{shown}}}}}"
        )
    return LibraryText(library, "\n".join(lines) + "\n", functions)
