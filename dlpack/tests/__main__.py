"""``python -m dlpack.tests [--builtin | --pytest] [ARGS]``: run dlpack's test suite here.

Exit status 0 when every selected test passed or was skipped, 1 when one failed (pytest's exit
codes otherwise). ``--builtin`` uses the built-in runner even when pytest is installed,
``--pytest`` insists on pytest; other arguments pass through (see ``dlpack.tests.run``).
"""

import sys

from dlpack.tests import run


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    use_pytest = None
    if "--builtin" in args:
        args.remove("--builtin")
        use_pytest = False
    if "--pytest" in args:
        args.remove("--pytest")
        use_pytest = True
    try:
        return run(*args, use_pytest=use_pytest)
    except ModuleNotFoundError as exc:
        if exc.name != "pytest":
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
