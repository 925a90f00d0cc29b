"""The package-shape figures of issue 10, measured on a source tree.

    python tools/shape_metrics.py [ROOT]

* modules in import cycles: strongly connected components (size > 1) of the
  graph of ``aiolock`` modules, every import counted (type-only and
  function-local ones included);
* the largest module, in lines;
* places where a primitive touches Client (or Engine) internals: accesses
  ``<x>._<name>`` in primitive modules whose receiver is the Client or its Engine
  (``client``, ``self._client``, ``hold.client``, ``self.client`` ...);
* reaches into another module's private names (``x._name``, x not self or
  cls, ``_name`` not defined in the module; ``from m import _name``), and
  the tests' reaches into ``._engine``;
* the duplicated blocks reported by the ``duplicates`` tool, if on PATH.

Reads files as text (ast); imports nothing from the tree.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PRIMITIVE_STEMS = {
    "_lock",
    "_fair",
    "_rwlock",
    "_semaphore",
    "_spin",
    "_multi",
    "_latch",
    "_primitive",
}
CLIENT_NAMES = {"client", "_client", "engine", "_engine"}


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(mod: str, path: Path, tree: ast.AST, known: set[str]) -> set[str]:
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - node.level + 1]
                target = ".".join(parent + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names]
            # "from . import x" of a submodule x imports x, not its package
            # (which is the one being imported, or already is).
            cands = subs if all(c in known for c in subs) else [target, *subs]
        elif isinstance(node, ast.Import):
            cands = [a.name for a in node.names]
        else:
            continue
        for c in cands:
            if c in known:
                out.add(c)
    out.discard(mod)
    return out


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    result: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            result.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return result


def engine_names(tree: ast.AST) -> set[str]:
    """The public names a primitive module uses on the Engine (its interface width)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not node.attr.startswith("_"):
            recv = node.value
            name = recv.id if isinstance(recv, ast.Name) else getattr(recv, "attr", None)
            if name in {"engine", "_engine"}:
                names.add(node.attr)
    return names


def client_touches(path: Path, tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        recv = node.value
        name = None
        if isinstance(recv, ast.Name):
            name = recv.id
        elif isinstance(recv, ast.Attribute):
            name = recv.attr
        if name in CLIENT_NAMES:
            count += 1
    return count


def private_defs(tree: ast.AST) -> set[str]:
    """Every ``_name`` a module defines: functions, classes, assignments,
    attributes set on anything (``self._x = ...``), parameters."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name.split(".")[0])
    return {n for n in out if n.startswith("_") and not n.startswith("__")}


def private_reaches(trees: dict[str, ast.AST]) -> dict[str, int]:
    """Reaches into another module's private names: ``x._name`` (x not
    ``self`` or ``cls``) where the module itself defines no ``_name``, and
    every ``from m import _name``."""
    reaches: dict[str, int] = {}
    for m, tree in trees.items():
        own = private_defs(tree)
        for node in ast.walk(tree):
            count = 0
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                recv = node.value
                private = node.attr.startswith("_") and not node.attr.startswith("__")
                mine = isinstance(recv, ast.Name) and recv.id in {"self", "cls"}
                count = int(private and not mine and node.attr not in own)
            elif isinstance(node, ast.ImportFrom):
                count = sum(
                    a.name.startswith("_") and not a.name.startswith("__") for a in node.names
                )
            if count:
                reaches[m] = reaches.get(m, 0) + count
    return dict(sorted(reaches.items()))


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    pkg = root / "aiolock"
    files = sorted(p for p in pkg.rglob("*.py"))
    mods = {module_name(root, p): p for p in files}
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}
    known = set(mods)
    graph = {m: imports_of(m, mods[m], trees[m], known) for m in mods}
    cyc = [c for c in sccs(graph) if len(c) > 1]
    in_cycles = sorted(m for c in cyc for m in c)
    print(f"modules: {len(mods)}")
    print(f"modules in import cycles: {len(in_cycles)} {in_cycles}")
    sizes = sorted(((len(p.read_text().splitlines()), m) for m, p in mods.items()), reverse=True)
    print(
        f"largest module: {sizes[0][1]} ({sizes[0][0]} lines); next: "
        + ", ".join(f"{m} {n}" for n, m in sizes[1:4])
    )
    touches = {}
    for m, p in mods.items():
        stem = m.split(".")[-1]
        if stem in PRIMITIVE_STEMS or ".primitives" in m or "._primitives" in m:
            n = client_touches(p, trees[m])
            if n:
                touches[m] = n
    print(f"primitive touches of Client internals: {sum(touches.values())} {touches}")
    reaches = private_reaches(trees)
    print(f"reaches into private names of other modules: {sum(reaches.values())} {reaches}")
    tests = root / "tests"
    if tests.is_dir():
        engine_reaches = sum(p.read_text().count("._engine") for p in tests.rglob("*.py"))
        print(f"tests reaching into ._engine: {engine_reaches}")
    used: set[str] = set()
    for m in mods:
        if "._primitives" in m:
            used |= engine_names(trees[m])
    print(f"Engine names the primitives use: {len(used)} {sorted(used)}")
    for sub in ("aiolock", "tests"):
        try:
            out = subprocess.run(
                ["duplicates", "--repo", str(root / sub), "--most", "1", "--seconds", "120"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.splitlines()
            print(f"duplicates in {sub}/: {out[0] if out else '?'}")
        except FileNotFoundError:
            print("duplicates: not on PATH")


if __name__ == "__main__":
    main()
