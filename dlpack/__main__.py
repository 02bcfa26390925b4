"""``python -m dlpack``: a report of this environment.

Our version and DLPack version, the array libraries and devices present (with versions), and a
provider x consumer table of real exchanges of small arrays: zero-copy, copy, or fails (with the
reason). A library that fails to import is reported as such. Exit status 0 unless dlpack itself is
broken.
"""

import argparse
import json
import sys

JSON_HELP = (
    "print a JSON document instead: dlpack's and Python's versions, the libraries (status, "
    "version, error), devices, and every exchange tried (device, provider, consumer, status, "
    "reason); its 'schema' number changes when a field changes meaning"
)


def _parser() -> argparse.ArgumentParser:
    details = __doc__.strip().partition("\n\n")[2]
    parser = argparse.ArgumentParser(
        prog="python -m dlpack",
        description=f"A report of this environment. {details}",
        epilog="python -m dlpack.tests runs the test suite.",
    )
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from dlpack._report import report
    except Exception as exc:  # noqa: BLE001 - our own package is broken: say so, exit 1
        broken = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"broken": broken}) if args.json else f"dlpack is broken here: {broken}")
        return 1
    return report(as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
