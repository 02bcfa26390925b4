"""The guide states the order in which ``asdlpack`` tries protocols as the code has it: the
numbered list in ``docs/guide/any-array.md`` must name ``dlpack._dlpack.IMPORT_ORDER`` (the
extension's table of steps, protocols only), one item each, in the same order.

    python tools/check_import_order.py

Each item's name is its text up to an opening parenthesis, without backticks. Exits 1 naming
the first difference.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dlpack._dlpack import IMPORT_ORDER

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "any-array.md"


def stated_order(text: str) -> list[str]:
    """The names of the first numbered list's items."""
    names: list[str] = []
    for line in text.splitlines():
        m = re.match(r"(\d+)\. (.*)", line)
        if m:
            names.append(m.group(2).split(" (")[0].replace("`", "").strip())
        elif names and line and not line.startswith(" "):
            break
    return names


def main() -> int:
    stated = stated_order(GUIDE.read_text(encoding="utf-8"))
    code = list(IMPORT_ORDER)
    if stated == code:
        print(f"import order: the guide states the code's {len(code)} protocols in order")
        return 0
    print(f"{GUIDE}: the list of protocols differs from dlpack._dlpack.IMPORT_ORDER")
    for k in range(max(len(stated), len(code))):
        a = stated[k] if k < len(stated) else "(nothing)"
        b = code[k] if k < len(code) else "(nothing)"
        print(f"  {k + 1}. guide: {a!r}  code: {b!r}" + ("" if a == b else "   <-"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
