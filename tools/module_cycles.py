"""Report import cycles between the Rust source files of each crate in the workspace, and between
the modules of the Python package.

Every file is a module (`lib.rs` the crate, `a/mod.rs` or `a.rs` the module `a`). A file depends
on the modules it names: `use` trees and paths in code that start with `crate::`, `super::`,
`self::` or a child module it declares, each resolved to the longest module prefix that is a file,
and on the children it declares (`mod x;`). A cycle is a strongly connected set of files; a
`mod.rs` that only declares and re-exports, with children that reach their siblings directly
(never through the parent), has none.

A Python module depends on the package's modules it imports anywhere in it (inside functions
too): `import a.b`, `from a import b` (`a.b` when that is a module, else `a`), relative imports
resolved.

    python tools/module_cycles.py [crate src dir ...]   (default: src, crates/*/src, and dlpack/)

Exits 1 when there is a cycle, printing each with the references that close it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_of(src: Path, file: Path) -> tuple[str, ...]:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts.pop()
    return ("crate", *parts)


def strip_comments_and_strings(text: str) -> str:
    """The code without comments and string literals (one pass, so neither hides the other)."""
    pattern = r'//[^\n]*|/\*.*?\*/|[bc]?"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\''
    return re.sub(pattern, lambda m: '""' if m.group().endswith('"') else " ", text, flags=re.S)


def expand_use_tree(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (aliases and globs kept as paths)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree]
    head, _, rest = tree.partition("{")
    inner = rest[: rest.rindex("}")]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    out = []
    for item in filter(None, items):
        for sub in expand_use_tree(item):
            out.append(head.rstrip(":") if sub == "self" else head + sub)
    return out


def inline_modules(code: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each inline `mod name { ... }` block (tests, mostly)."""
    blocks = []
    for match in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
        depth, i = 1, match.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        blocks.append((match.end(), i, match.group(1)))
    return blocks


def referenced_paths(code: str, children: set[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Paths the code names, each with the inline modules it is named from (innermost last)."""
    blocks = inline_modules(code)

    def inside(at: int) -> tuple[str, ...]:
        return tuple(name for start, end, name in blocks if start <= at < end)

    paths = []
    for match in re.finditer(r"\buse\s+([^;]+);", code):
        paths += [(p, inside(match.start())) for p in expand_use_tree(match.group(1))]
    code_without_uses = re.sub(r"\buse\s+[^;]+;", lambda m: " " * len(m.group()), code)
    starts = "|".join(["crate", "super", "self", *sorted(children)])
    for match in re.finditer(rf"\b(?:{starts})(?:::\w+)+", code_without_uses):
        paths.append((match.group(), inside(match.start())))
    return paths


def resolve(path: str, here: tuple[str, ...], modules: set) -> tuple | None:
    parts = path.split("::")
    if parts[0] == "crate":
        absolute = parts
    else:
        base = list(here)
        while parts and parts[0] in ("self", "super"):
            if parts.pop(0) == "super":
                base.pop()
        absolute = base + parts
    for n in range(len(absolute), 0, -1):
        if tuple(absolute[:n]) in modules:
            return tuple(absolute[:n])
    return None


def crate_graph(src: Path) -> tuple[dict, dict]:
    files = {module_of(src, f): f for f in sorted(src.rglob("*.rs"))}
    modules = set(files)
    edges: dict[tuple, dict[tuple, set[str]]] = {m: {} for m in modules}
    for module, file in files.items():
        code = strip_comments_and_strings(file.read_text())
        children = set(re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code, re.M))
        for child in children:
            target = (*module, child)
            if target in modules:
                edges[module].setdefault(target, set()).add(f"mod {child};")
        for path, inline in referenced_paths(code, children):
            target = resolve(path, (*module, *inline), modules)
            if target is not None and target != module:
                edges[module].setdefault(target, set()).add(path)
    return files, edges


def python_graph(package: Path) -> tuple[dict, dict]:
    files = {}
    for file in sorted(package.rglob("*.py")):
        parts = file.relative_to(package.parent).with_suffix("").parts
        files[parts[:-1] if parts[-1] == "__init__" else parts] = file
    names = {".".join(m): m for m in files}
    edges: dict[tuple, dict[tuple, set[str]]] = {m: {} for m in files}
    for module, file in files.items():
        home = module if file.name == "__init__.py" else module[:-1]
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = ".".join(home[: len(home) - (node.level - 1)])
                    base = f"{anchor}.{base}" if base else anchor
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names
                ]
            else:
                continue
            for target in targets:
                if target in names and names[target] != module:
                    edges[module].setdefault(names[target], set()).add(f"line {node.lineno}")
    return files, edges


def cycles(edges: dict) -> list[list]:
    """Strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> int:
    crates = sorted((ROOT / "crates").glob("*/src"))
    dirs = [Path(a).resolve() for a in argv] or [ROOT / "src", *crates, ROOT / "dlpack"]
    status = 0
    for src in dirs:
        python = (src / "__init__.py").exists()
        files, edges = python_graph(src) if python else crate_graph(src)
        found = cycles(edges)
        name = src.name if python else src.parent.name if src.parent != ROOT else "extension"
        print(f"{name} ({src}): {len(files)} files, {len(found)} cycles")
        for component in found:
            status = 1
            print("  cycle:")
            members = set(component)
            for module in component:
                for target, via in sorted(edges[module].items()):
                    if target in members:
                        here, there = (files[m].relative_to(src) for m in (module, target))
                        print(f"    {here} -> {there}: {', '.join(sorted(via))}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
