"""Every figure the README states comes from a named row of the benchmarks page, and equals it.

    python tools/check_readme_figures.py [README.md [docs/benchmarks.md]]
    python tools/check_readme_figures.py --self-test   # shows it refuses what it should

A figure (a number with a unit: ``3.2×``, ``8.2 µs``, ``64 MiB``, ``1.5 GB/s``, ``10%``) in the
README's text, outside code, is followed at once by an HTML comment naming where it comes from,
which Markdown doesn't show::

    3.2×<!-- benchmarks: torch and JAX | pytree of 1,000 small tensors, round trip | ratio -->

that is: a heading of ``docs/benchmarks.md`` (its text, any level), the first cell of a table row
under that heading (before the next heading of the same or a higher level), and a column of
that table by its header. The cell must hold the same number with the same unit (``3.2× faster``
holds ``3.2×``). Exits 1 naming each figure without a marker, each marker naming no row or
cell, and each figure that differs from its cell.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNIT = r"(?:×|x\b|µs|ns|ms|s\b|GB/s|MB/s|[KMG]iB|%)"
FIGURE = re.compile(r"(?<![\w.,])(\d+(?:[.,]\d+)*)\s?(" + UNIT + ")")
MARKER = re.compile(r"<!--\s*benchmarks:(?P<where>.*?)-->", re.S)
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass
class Table:
    heading: str
    header: list[str]
    rows: dict[str, list[str]]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[Table]:
    """The tables of a Markdown page, each under the heading it falls below (any level up)."""
    found: list[Table] = []
    open_headings: list[tuple[int, str]] = []
    lines = text.splitlines()
    in_code = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code and (m := HEADING.match(line)):
            level = len(m.group(1))
            open_headings = [(lv, h) for lv, h in open_headings if lv < level] + [
                (level, m.group(2))
            ]
        elif (
            not in_code
            and line.lstrip().startswith("|")
            and i + 1 < len(lines)
            and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1])
        ):
            header = cells(line)
            rows: dict[str, list[str]] = {}
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                row = cells(lines[i])
                rows.setdefault(row[0], row)
                i += 1
            for _, heading in open_headings:
                found.append(Table(heading, header, rows))
            continue
        i += 1
    return found


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the text outside fenced code."""
    out = []
    in_code = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            out.append((number, line))
    return out


def blank(match: re.Match[str]) -> str:
    return " " * len(match.group(0))


def lookup(where: str, pages: list[Table]) -> tuple[str | None, str]:
    """The cell a marker names, or None and why not."""
    parts = [p.strip() for p in where.split(" | ")]
    if len(parts) != 3:
        return None, f"names {len(parts)} parts, not 'heading | row | column'"
    heading, row, column = parts
    under = [t for t in pages if t.heading == heading]
    if not under:
        return None, f"no heading {heading!r} with a table under it"
    matches = [t for t in under if row in t.rows]
    if not matches:
        return None, f"no row {row!r} in the tables under {heading!r}"
    if len(matches) > 1:
        return (
            None,
            f"row {row!r} is in {len(matches)} tables under {heading!r}: name a deeper heading",
        )
    table = matches[0]
    if column not in table.header:
        return None, f"no column {column!r} in that table (its columns: {table.header})"
    index = table.header.index(column)
    values = table.rows[row]
    if index >= len(values):
        return None, f"row {row!r} has no cell in column {column!r}"
    return values[index], ""


def problems(readme: str, benchmarks: str, name: str = "README.md") -> list[str]:
    pages = tables(benchmarks)
    found: list[str] = []
    for number, line in prose(readme):
        markers = {m.start(): m for m in MARKER.finditer(line)}
        # Markers (which may quote code) and inline code hold no figures of the text.
        blanked = re.sub(r"`[^`]*`", blank, MARKER.sub(blank, line))
        for figure in FIGURE.finditer(blanked):
            value, unit, stated = figure.group(1), figure.group(2), figure.group(0)
            marker = markers.get(figure.end())
            if marker is None:
                found.append(
                    f"{name}:{number}: {stated} names no row of docs/benchmarks.md (follow it "
                    "with <!-- benchmarks: heading | row | column -->)"
                )
                continue
            cell, why = lookup(marker.group("where"), pages)
            if cell is None:
                found.append(f"{name}:{number}: the marker after {stated}: {why}")
                continue
            measured = [(m.group(1), m.group(2)) for m in FIGURE.finditer(cell)]
            if (value, unit) not in measured:
                found.append(
                    f"{name}:{number}: {stated} differs from docs/benchmarks.md, which says "
                    f"{cell!r} there"
                )
    return found


# Pages the self-test checks, with what it must find in each.
BENCH = """# Benchmarks

## torch and JAX

| case | ours | ratio |
|---|---:|---:|
| round trip | 19.05 ms | 3.2× faster |

## Copies

| case | ours | ratio |
|---|---:|---:|
| round trip | 4.1 ms | 1.3× |
| `f(a)` vs g | 2 ns | g/ours = 131× |
"""
CASES = [
    ("a 3.2×<!-- benchmarks: torch and JAX | round trip | ratio --> speed-up", []),
    ("in 19.05 ms<!-- benchmarks: torch and JAX | round trip | ours -->", []),
    ("a 5.4×<!-- benchmarks: torch and JAX | round trip | ratio --> speed-up", ["differs"]),
    ("a 1.3×<!-- benchmarks: torch and JAX | round trip | ratio -->", ["differs"]),
    ("a 1.3×<!-- benchmarks: Copies | round trip | ratio -->", []),
    ("`f(a)` is 131×<!-- benchmarks: Copies | `f(a)` vs g | ratio --> faster", []),
    ("a 3.2× speed-up", ["names no row"]),
    ("a 3.2×<!-- benchmarks: Speed | round trip | ratio -->", ["no heading"]),
    ("a 3.2×<!-- benchmarks: torch and JAX | one way | ratio -->", ["no row"]),
    ("a 3.2×<!-- benchmarks: torch and JAX | round trip | goal -->", ["no column"]),
    ("a 3.2×<!-- benchmarks: Benchmarks | round trip | ratio -->", ["in 2 tables"]),
    ("Python 3.11, 1,000 tensors, `64 MiB` in code, 0x7f", []),
    ("5.4x faster", ["names no row"]),
    ("```\n64 MiB in a block\n```", []),
]


def self_test() -> int:
    wrong = []
    for readme, expected in CASES:
        got = problems(readme, BENCH)
        if len(got) != len(expected) or not all(
            e in g for e, g in zip(expected, got, strict=False)
        ):
            wrong.append(f"self-test: {readme!r} gave {got}, expected {expected}")
    for w in wrong:
        print(w)
    print("self-test:", "ok" if not wrong else f"{len(wrong)} misjudged")
    return 1 if wrong else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    args = [Path(a) for a in sys.argv[1:]]
    readme = args[0] if args else ROOT / "README.md"
    benchmarks = args[1] if len(args) > 1 else ROOT / "docs" / "benchmarks.md"
    found = problems(
        readme.read_text(encoding="utf-8"), benchmarks.read_text(encoding="utf-8"), readme.name
    )
    for p in found:
        print(p)
    if found:
        return 1
    print(f"{readme.name}: every figure is its row of {benchmarks.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
