"""``python -m dlpack.tests [PYTEST ARGS]``: run dlpack's test suite here, with pytest.

Arguments pass through to pytest (see ``dlpack.tests.run``); the exit status is pytest's (0 when
every selected test passed or was skipped, 1 when one failed), or 1 when the run ended before
pytest finished. Without pytest it prints what to install and exits with status 4.
"""

import sys

from dlpack.tests import run

if __name__ == "__main__":
    sys.exit(run(*sys.argv[1:]))
