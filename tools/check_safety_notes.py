#!/usr/bin/env python
"""SAFETY notes that say why where they stand: every ``// SAFETY:`` note names its reason in
place, so a reader at the block sees why it holds without hunting for the note it points to.

    python tools/check_safety_notes.py [paths...]

A note is refused when it points elsewhere ("as said", "as above", "as before", "as for
`other`", "as in `other`", "as `other` vouched", "as documented", "see above", "likewise") or
says no more than "per the contract" (the function's
``# Safety`` section is not the reason: which of its conditions makes this block sound is).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["src", "crates", "examples", "bench"]
POINTERS = re.compile(
    r"\bas (just )?(said|above|before|documented)\b|\bas (for|in) `|\bas `[^`]*` \w+ed\b"
    r"|\bsee (above|below)\b|\blikewise\b",
    re.I,
)
CONTRACT = re.compile(
    r"\b(per|by|under) (the|its|this function's|our) contract\b|\(the contract\)", re.I
)


def notes(text: str):
    """(line, text) of each SAFETY note: the comment line saying SAFETY and those after it."""
    lines = text.splitlines()
    k = 0
    while k < len(lines):
        m = re.match(r"\s*//\s*SAFETY:(.*)", lines[k])
        if not m:
            k += 1
            continue
        start, body = k + 1, [m.group(1)]
        k += 1
        while k < len(lines) and re.match(r"\s*//(?!\s*SAFETY:)", lines[k]):
            body.append(re.sub(r"^\s*//", "", lines[k]))
            k += 1
        yield start, " ".join(b.strip() for b in body).strip()


def problems(path: Path, text: str):
    for line, note in notes(text):
        if POINTERS.search(note):
            yield f"{path}:{line}: points elsewhere instead of saying why: {note[:80]!r}"
            continue
        rest = re.sub(r"[^\w`]+", " ", CONTRACT.sub(" ", note)).split()
        if len(rest) < 3:
            yield f"{path}:{line}: names no reason: {note[:80]!r}"


# Notes the check must refuse and notes it must let through, run by --self-test.
REFUSED = [
    "as in `host_allocation`.",
    "as documented; a column.",
    "as `as_slice` vouched, plus: writable memory",
    "as said above.",
    "per the contract.",
]
ALLOWED = [
    "`layout` addresses only bytes of the buffer (checked just above), memory we allocated.",
    "row i, valid per the contract: every element of the two loops is valid.",
]


def self_test() -> int:
    wrong = [n for n in REFUSED if not list(problems(Path("x.rs"), f"// SAFETY: {n}"))]
    wrong += [n for n in ALLOWED if list(problems(Path("x.rs"), f"// SAFETY: {n}"))]
    for n in wrong:
        print(f"self-test: misjudged {n!r}")
    return 1 if wrong else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    paths = [Path(p) for p in sys.argv[1:]] or [ROOT / d for d in DEFAULT]
    found = []
    for p in paths:
        files = [p] if p.is_file() else sorted(p.rglob("*.rs"))
        for f in files:
            if "target" in f.parts:
                continue
            shown = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
            found.extend(problems(shown, f.read_text(encoding="utf-8")))
    for p in found:
        print(p)
    print(f"{len(found)} SAFETY notes to rewrite" if found else "SAFETY notes: each says why")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
