#!/usr/bin/env python
"""Messages without holes: every string literal in the Rust and Python sources reads as one line
of text where it is meant to, so a message never carries a line break and indentation from a
broken continuation ("copy it to the host              first"), nor two words run together
where adjacent literals were joined without a space.

    python tools/check_messages.py [paths...]
    python tools/check_messages.py --self-test   # shows it finds the holes it should, only those

Rust: a non-raw string literal that spans lines must end each line with a backslash (which
drops the line break and the next line's indentation); one that doesn't is a hole, unless the
line break is the text (a literal whose lines start at column 0, as test data writes them).
Python: adjacent literals joined implicitly, where the first ends in a letter, digit or
punctuation and the second starts with a letter or digit, are two words run together. A literal
may say it is meant that way with a ``# messages: joined`` comment on its line.
"""

from __future__ import annotations

import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["src", "crates", "examples", "bench", "dlpack", "tools"]
SKIP_DIRS = {"target", ".venv", "__pycache__", "node_modules"}


def rust_literals(text: str):
    """(line, literal body) of each non-raw string literal in Rust source, comments skipped."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
        elif (
            c == "r"
            and re.match(r'r#*"', text[i:])
            and not (i and (text[i - 1].isalnum() or text[i - 1] == "_"))
        ):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            line += text.count("\n", i, end)
            i = end
        elif c == "'":
            # A char literal ('"', '\'') or a lifetime: skip a char literal whole.
            m = re.match(r"'(\\.|[^\\'\n])'", text[i:]) or re.match(
                r"'\\u\{[0-9a-fA-F]+\}'", text[i:]
            )
            i += len(m.group(0)) if m else 1
        elif c == '"':
            start_line, j = line, i + 1
            while j < n and text[j] != '"':
                if text[j] == "\\":
                    j += 1
                j += 1
            body = text[i + 1 : j]
            line += body.count("\n")
            yield start_line, body
            i = j + 1
        else:
            i += 1


def rust_holes(path: Path, text: str):
    for line, body in rust_literals(text):
        parts = body.split("\n")
        for k, part in enumerate(parts[:-1]):
            following = parts[k + 1]
            if part.endswith("\\"):
                continue
            if following[:1] not in (" ", "\t"):
                continue  # a line break that is the text (test data at column 0)
            yield (
                f"{path}:{line + k}: a line break and indentation inside a string literal "
                f"(end the line with a backslash): {part.strip()[-40:]!r}"
            )


def python_holes(path: Path, text: str):
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return
    lines = text.splitlines()
    prev = None
    for tok in tokens:
        if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.NEWLINE):
            if tok.type == tokenize.NEWLINE:
                prev = None
            continue
        if tok.type == tokenize.STRING and prev is not None and prev.type == tokenize.STRING:
            first, second = _body(prev.string), _body(tok.string)
            line = lines[prev.start[0] - 1]
            ends_line = first.endswith("\\n")
            if (
                first
                and second
                and not ends_line
                and re.search(r"[\w.,;:!?)]$", first)
                and re.match(r"[\w(]", second)
                and "messages: joined" not in line
            ):
                yield (
                    f"{path}:{prev.start[0]}: adjacent literals run two words together: "
                    f"{first[-20:]!r} + {second[:20]!r}"
                )
        prev = tok


def _body(literal: str) -> str:
    m = re.match(r"(?is)^([rbfu]*)('''|\"\"\"|'|\")(.*)\2$", literal)
    return m.group(3) if m else ""


def files(paths):
    for p in paths:
        p = Path(p)
        if p.is_file():
            yield p
            continue
        for f in sorted(p.rglob("*")):
            if f.suffix in (".rs", ".py") and not SKIP_DIRS & set(f.parts):
                yield f


SELF_TEST_RUST = (
    'let hole = "copy it to the host\n             first";\n'
    'let fine = "a \\\n      b";\n'
    "let quote = '\"';\n"
    'let raw = r#"x\n  y"#;\n'
    'let data = "line\nline";\n'
)
SELF_TEST_PYTHON = 'x = ("one word" "two")\ny = ("fine " "two")\nz = ("a\\n" "b")\n'


def self_test() -> int:
    rust = list(rust_holes(Path("t.rs"), SELF_TEST_RUST))
    python = list(python_holes(Path("t.py"), SELF_TEST_PYTHON))
    ok = len(rust) == 1 and "t.rs:1:" in rust[0] and len(python) == 1 and "t.py:1:" in python[0]
    print("self-test:", "ok" if ok else f"wrong: {rust + python}")
    return 0 if ok else 1


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    paths = sys.argv[1:] or [ROOT / d for d in DEFAULT]
    problems = []
    for f in files(paths):
        text = f.read_text(encoding="utf-8")
        check = rust_holes if f.suffix == ".rs" else python_holes
        problems.extend(check(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f, text))
    for p in problems:
        print(p)
    print(f"{len(problems)} message holes" if problems else "messages: no holes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
