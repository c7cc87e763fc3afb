#!/usr/bin/env bash
# Set up (infra/setup.sh) and run the whole test suite, real-model tests included.
# Extra arguments go to pytest, e.g.  bash infra/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
exec .venv/bin/python -m pytest -q "$@"
