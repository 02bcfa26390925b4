"""``python -m dlpack``: a report of this environment.

Our version and DLPack version, the array libraries and devices present (with versions), and a
provider x consumer table of real exchanges of small arrays: zero-copy, copy, or fails (with the
reason). A library that fails to import is reported as such. Exit status 0 unless dlpack itself is
broken.
"""

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    details = __doc__.strip().partition("\n\n")[2]
    return argparse.ArgumentParser(
        prog="python -m dlpack",
        description=f"A report of this environment. {details}",
        epilog="python -m dlpack.tests runs the test suite.",
    )


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    try:
        from dlpack._report import report
    except Exception as exc:  # noqa: BLE001 - our own package is broken: say so, exit 1
        print(f"dlpack is broken here: {type(exc).__name__}: {exc}")
        return 1
    return report()


if __name__ == "__main__":
    sys.exit(main())
