import sys

import pytest

from ._helpers import need


def pytest_report_header(config):
    try:
        import dlpack

        where = dlpack.__file__
    except Exception as exc:  # pragma: no cover - reported, not hidden
        where = f"IMPORT FAILED: {exc!r}"
    return [f"dlpack: {where}", f"python: {sys.version.split()[0]}"]


@pytest.fixture
def np():
    return need("numpy")
