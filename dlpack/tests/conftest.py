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


@pytest.fixture
def x64():
    """Run a test with JAX's 64-bit types enabled."""
    jax = need("jax")
    with jax.enable_x64(True):
        yield
