"""``python -m dlpack``: a report of this environment.

Our version and DLPack version, the array libraries and devices present (with versions), and a
provider x consumer table of real exchanges of small arrays: zero-copy, copy, or fails (with the
reason). A library that fails to import is reported as such. Exit status 0 unless dlpack itself is
broken.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip())
        print("\nusage: python -m dlpack   (python -m dlpack.tests runs the test suite)")
        return 0
    try:
        from dlpack._report import report
    except Exception as exc:  # noqa: BLE001 - our own package is broken: say so, exit 1
        print(f"dlpack is broken here: {type(exc).__name__}: {exc}")
        return 1
    return report()


if __name__ == "__main__":
    sys.exit(main())
