#!/usr/bin/env bash
# Runs the test suite with the project venv's pytest; arguments go to pytest.
# pytest exits 5 when it collected no tests. That must never look green (a
# typo in -k, or a broken collection, would otherwise pass CI), so it is
# turned into a failure.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# pytest keeps each test file's assert-rewritten bytecode in __pycache__
# (git-ignored, used by pytest only, redone when the file changes). Where
# PYTHONDONTWRITEBYTECODE is set it never writes it, and every run and every
# xdist worker rewrites all test files again: about 13 s of CPU a process.
unset PYTHONDONTWRITEBYTECODE

status=0
"$root/.venv/bin/python" -m pytest "$@" || status=$?

if [ "$status" -eq 5 ]; then
    echo "scripts/pytest.sh: pytest collected no tests (exit 5); treating that as a failure" >&2
    exit 1
fi
exit "$status"
