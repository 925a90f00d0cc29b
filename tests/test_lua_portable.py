"""Every script runs unchanged on Lua 5.1 and Lua 5.4.

Redis and Valkey embed Lua 5.1; Dragonfly and some compatible servers run
Lua 5.4, where ``unpack``, ``setfenv``, ``loadstring`` and ``table.getn`` are
gone and ``table.unpack`` is new (5.1 lacks it). Two checks per script, as
the runner sends it (includes expanded; standalone and cluster forms):

* it compiles under both languages (real Lua 5.1 and 5.4 from lupa);
* every global it reads, and every ``string.x`` / ``table.x`` / ``math.x``
  it calls, exists in both, or is one that Redis gives a script (``KEYS``,
  ``ARGV``, ``redis``, ``cjson``, ``cmsgpack``, ``bit``, ``struct``).

The second check reads the source (a small Lua tokenizer below): a name is
global unless the script declares it (``local``, a parameter, a ``for``
variable) somewhere.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from lupa import lua51, lua54

from aiolock._core.protocol.scripts import load_scripts

#: What Redis (and Valkey, and the compatible servers) give a script.
REDIS_GLOBALS = frozenset({"KEYS", "ARGV", "redis", "cjson", "cmsgpack", "bit", "struct"})
LIBRARIES = ("string", "table", "math")
KEYWORDS = frozenset(
    "and break do else elseif end false for function goto if in local nil not or "
    "repeat return then true until while".split()
)

RUNTIMES = {"5.1": lua51.LuaRuntime(), "5.4": lua54.LuaRuntime()}


def _names(runtime: Any, table: str | None = None) -> set[str]:
    found = runtime.eval(f"function() local t = {{}} for k in pairs({table or '_G'}) do "
                         "t[#t + 1] = k end return t end")()  # fmt: skip
    return {str(v) for v in found.values()}


#: The globals, and the library members, that both languages have.
COMMON = set.intersection(*(_names(r) for r in RUNTIMES.values())) | REDIS_GLOBALS
MEMBERS = {
    lib: set.intersection(*(_names(r, lib) for r in RUNTIMES.values())) for lib in LIBRARIES
}


def _sources() -> dict[str, str]:
    """Every script as the runner sends it, standalone and cluster forms."""
    out = {name: s.source for name, s in load_scripts().items()}
    for name, s in load_scripts(cluster=True).items():
        out[f"{name}[cluster]"] = s.source
    return out


SOURCES = _sources()

_LONG_BRACKET = re.compile(r"\[(=*)\[.*?\]\1\]", re.S)
_COMMENT = re.compile(r"--\[(=*)\[.*?\]\1\]|--[^\n]*", re.S)
_STRING = re.compile(r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"")


def _code(source: str) -> str:
    """The source without its shebang line, comments and string literals."""
    if source.startswith("#!"):
        source = source.partition("\n")[2]
    out = []
    i = 0
    # Comments and strings in source order, so ``'--'`` in a string is not a comment.
    token = re.compile(f"{_COMMENT.pattern}|{_STRING.pattern}|{_LONG_BRACKET.pattern}", re.S)
    for m in token.finditer(source):
        out.append(source[i : m.start()])
        out.append(" " if m.group(0).startswith("--") else '""')
        i = m.end()
    out.append(source[i:])
    return "".join(out)


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def _declared(code: str) -> set[str]:
    names: set[str] = set()
    for m in re.finditer(rf"\blocal\s+function\s+({_IDENT})", code):
        names.add(m.group(1))
    for m in re.finditer(rf"\blocal\s+({_IDENT}(?:\s*,\s*{_IDENT})*)", code):
        names.update(n.strip() for n in m.group(1).split(","))
    for m in re.finditer(r"\bfunction\b[^(]*\(([^)]*)\)", code):
        names.update(n.strip() for n in m.group(1).split(",") if n.strip() not in ("", "..."))
    for m in re.finditer(rf"\bfor\s+({_IDENT}(?:\s*,\s*{_IDENT})*)\s*(?:=|\bin\b)", code):
        names.update(n.strip() for n in m.group(1).split(","))
    return names


def _globals_read(code: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The free names a script reads, and the ``lib.member`` it uses."""
    declared = _declared(code) - {"function"}
    free: set[str] = set()
    members: set[tuple[str, str]] = set()
    for m in re.finditer(_IDENT, code):
        name, start, end = m.group(0), m.start(), m.end()
        before = code[:start].rstrip()[-1:]
        after = code[end:].lstrip()
        if name in KEYWORDS or before in (".", ":"):
            continue
        if before in ("{", ",") and re.match(r"=(?!=)", after):
            continue  # a field name in a table constructor: { name = ... }
        if name in LIBRARIES and after.startswith("."):
            member = re.match(rf"\.\s*({_IDENT})\s*(\bor\b)?", after)
            if member and not member.group(2):  # ``table.unpack or unpack``: guarded
                members.add((name, member.group(1)))
        if name not in declared:
            free.add(name)
    return free, members


def test_the_tokenizer_finds_what_lua_5_4_lacks() -> None:
    """The check can fail: a global ``unpack`` and ``table.getn`` are found."""
    source = "local a = {1}\n-- unpack(a) in a comment\nreturn unpack(a), table.getn(a), 'x.unpack'"
    free, members = _globals_read(_code(source))
    assert "unpack" in free and "unpack" not in COMMON
    assert ("table", "getn") in members and "getn" not in MEMBERS["table"]
    assert "a" not in free
    guarded = _globals_read(_code("local unpack = table.unpack or unpack\nreturn unpack({})"))
    assert guarded == ({"table"}, set())


_COMPILE = (
    "function(s) local f, err = nil, nil "
    "if loadstring then f, err = loadstring(s) else f, err = load(s) end return err end"
)


@pytest.mark.parametrize("version", sorted(RUNTIMES))
def test_every_script_compiles(version: str) -> None:
    compile_ = RUNTIMES[version].eval(_COMPILE)
    failed = {}
    for name, source in SOURCES.items():
        if source.startswith("#!"):
            source = "--" + source  # the shebang is Redis's, not Lua's
        error = compile_(source)
        if error is not None:
            failed[name] = error
    assert not failed, f"scripts that do not compile on Lua {version}: {failed}"


def test_every_script_reads_only_what_both_languages_have() -> None:
    assert len(SOURCES) > 50
    wrong = {}
    for name, source in SOURCES.items():
        free, members = _globals_read(_code(source))
        missing = sorted(free - COMMON) + sorted(
            f"{lib}.{m}" for lib, m in members if m not in MEMBERS[lib]
        )
        if missing:
            wrong[name] = missing
    assert not wrong, f"globals or library members missing in Lua 5.1 or 5.4: {wrong}"
