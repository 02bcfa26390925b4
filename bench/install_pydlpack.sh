#!/usr/bin/env bash
# Install the competitor `pydlpack` (import name `dlpack`, same as ours) into bench/.pydlpack so
# the benchmark can time it in a separate subprocess without shadowing our package.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
"$python" -m pip install --no-deps --target "$here/.pydlpack" pydlpack==0.2.1
