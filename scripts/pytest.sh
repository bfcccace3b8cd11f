#!/usr/bin/env bash
# Runs the test suite with the project venv's pytest; arguments go to pytest.
# pytest exits 5 when it collected no tests. That must never look green (a
# typo in -k, or a broken collection, would otherwise pass CI), so it is
# turned into a failure.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

status=0
"$root/.venv/bin/python" -m pytest "$@" || status=$?

if [ "$status" -eq 5 ]; then
    echo "scripts/pytest.sh: pytest collected no tests (exit 5); treating that as a failure" >&2
    exit 1
fi
exit "$status"
