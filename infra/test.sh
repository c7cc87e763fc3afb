#!/usr/bin/env bash
# Set up (infra/setup.sh) and run the whole test suite, real-model tests included.
# Extra arguments go to pytest, e.g.  bash infra/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
# headless Chromium renders the HTML report in tests/e2e/test_report.py (Debian's package; root on CI)
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "spectune: install chromium (e.g. apt-get install chromium) for the HTML report test" >&2
  fi
fi
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
# Python's bytecode cache on (a shell may turn it off): each of the suite's ~500 processes (Ray actors, drivers,
# CLIs) would otherwise compile this repository's modules again, and every pytest worker rewrite the tests'
# asserts again; the caches land in __pycache__/ folders git ignores
unset PYTHONDONTWRITEBYTECODE
# lint and format first: a second or two, and a failure names the file and line
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# three workers on the 2-core CI machine: the e2e tests wait on Ray and subprocesses much of the time
# (measured: 16 min 10 s with -n 3 against ~27 min serial); `-n 0` among the arguments runs serially.
# Longest first (tests/conftest.py orders them by tests/durations.json), one test at a time to whichever
# worker is free: the long studies start early and spread over the workers
exec .venv/bin/python -m pytest -q -n 3 --dist load --maxschedchunk 1 "$@"
