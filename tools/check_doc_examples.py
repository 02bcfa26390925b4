"""Run every Python example in the README and the docs, and fail naming the file and line of any
that raises.

    python tools/check_doc_examples.py [-v] [--list] [FILE.md ...]

Collects the ```python fenced blocks of README.md, CHANGELOG.md and docs/**/*.md (or of the files
named). Each Markdown file becomes one script, its blocks in order, each at the line numbers it
has in the Markdown file (everything else is blank lines), run in a fresh interpreter in a
temporary directory: the blocks of a file share one namespace, as if a reader typed them into one
script, and a traceback's line numbers are the Markdown file's. Examples run as a script's
``__main__``, so ones that start processes (``multiprocessing`` with spawn, a Dask cluster) work
as they would for a reader, ``if __name__ == "__main__":`` guard included.

A block is skipped only when the line right before its opening fence is an HTML comment
``<!-- no-test: reason -->`` (which Markdown doesn't show; say the reason in the text too): for
examples that need a GPU or a cluster. Nothing else is skipped: an example that imports a library
that isn't installed fails. Exits 1 when an example fails, when a fence isn't closed, or when
there are no examples to run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
NO_TEST = re.compile(r"^\s*<!--\s*no-test\b.*-->\s*$")
# How long one file's examples may run (a Dask cluster starts in a few seconds).
TIMEOUT_S = 300


@dataclass
class Block:
    path: Path
    line: int  # the first line of code (1-based), the line after the opening fence
    lines: list[str]
    skipped: bool


def markdown_files(args: list[str]) -> list[Path]:
    if args:
        return [Path(a).resolve() for a in args]
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return [f for f in files if f.exists()]


def blocks_of(path: Path) -> list[Block]:
    """The ```python blocks of a Markdown file, dedented by their fence's indentation."""
    text = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(text):
        m = FENCE.match(text[i])
        if m is None:
            i += 1
            continue
        fence, indent = m["fence"], m["indent"]
        language = m["info"].split()[0].lower() if m["info"].split() else ""
        start = i + 1
        j = start
        while j < len(text):
            close = FENCE.match(text[j])
            if (
                close is not None
                and close["fence"][0] == fence[0]
                and len(close["fence"]) >= len(fence)
                and not close["info"]
            ):
                break
            j += 1
        else:
            raise SystemExit(f"{rel(path)}:{i + 1}: code fence not closed")
        if language in ("python", "py"):
            body = [dedent(line, indent) for line in text[start:j]]
            skipped = i > 0 and NO_TEST.match(text[i - 1]) is not None
            blocks.append(Block(path, start + 1, body, skipped))
        i = j + 1
    return blocks


def dedent(line: str, indent: str) -> str:
    return line[len(indent) :] if line.startswith(indent) else line.lstrip(" \t")


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def script_of(blocks: list[Block]) -> str:
    """The blocks of one file as one script, each block at its Markdown line numbers."""
    last = max(b.line + len(b.lines) for b in blocks)
    lines = [""] * last
    for b in blocks:
        if not b.skipped:
            lines[b.line - 1 : b.line - 1 + len(b.lines)] = b.lines
    return "\n".join(lines) + "\n"


def run_file(path: Path, blocks: list[Block], workdir: Path, verbose: bool) -> bool:
    script = workdir / (rel(path).replace(os.sep, "__") + ".py")
    script.write_text(script_of(blocks), encoding="utf-8")
    # The examples import dlpack as a reader would: the installed package (or whatever
    # PYTHONPATH names), never this checkout by accident (the script runs in a temporary
    # directory).
    env = dict(os.environ)
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        print(f"FAIL {rel(path)}: its examples ran past {TIMEOUT_S} s")
        return False
    took = time.perf_counter() - started
    output = (done.stdout + done.stderr).replace(str(script), rel(path))
    tested = [b for b in blocks if not b.skipped]
    if done.returncode == 0:
        print(f"ok   {rel(path)}: {len(tested)} examples ({took:.1f} s)")
        if verbose and output.strip():
            print(indent_text(output))
        return True
    # The failing line: the last frame in the Markdown file's script.
    frames = re.findall(rf'File "{re.escape(rel(path))}", line (\d+)', output)
    where = f"{rel(path)}:{frames[-1]}" if frames else rel(path)
    block = next(
        (b for b in tested if frames and b.line <= int(frames[-1]) < b.line + len(b.lines)), None
    )
    what = f" (the example at line {block.line})" if block is not None else ""
    print(f"FAIL {where}{what}: exit status {done.returncode}")
    print(indent_text(output))
    return False


def indent_text(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("files", nargs="*", help="Markdown files (default: README, docs/)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show examples' output")
    parser.add_argument("--list", action="store_true", help="list the examples, run nothing")
    args = parser.parse_args(argv)

    by_file = {path: blocks_of(path) for path in markdown_files(args.files)}
    by_file = {path: blocks for path, blocks in by_file.items() if blocks}
    tested = sum(not b.skipped for blocks in by_file.values() for b in blocks)
    skipped = [b for blocks in by_file.values() for b in blocks if b.skipped]
    if args.list:
        for blocks in by_file.values():
            for b in blocks:
                print(f"{rel(b.path)}:{b.line}{'  (no-test)' if b.skipped else ''}")
        return 0
    if tested == 0:
        print("FAIL: no Python examples found to run")
        return 1

    failed = []
    with tempfile.TemporaryDirectory(prefix="doc-examples-") as tmp:
        for path, blocks in by_file.items():
            if all(b.skipped for b in blocks):
                continue
            workdir = Path(tmp) / rel(path).replace(os.sep, "__")
            workdir.mkdir()
            if not run_file(path, blocks, workdir, args.verbose):
                failed.append(path)
    for b in skipped:
        print(f"skip {rel(b.path)}:{b.line} (marked no-test)")
    print(
        f"{tested} examples in {len(by_file)} files: "
        + (f"{len(failed)} files failed" if failed else "all ran")
        + f", {len(skipped)} marked no-test"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
