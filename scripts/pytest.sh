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

# Hypothesis runs its plugins' entry points as it is imported: it reads
# every installed distribution's metadata and imports trio, whose plugin is
# the only one and which no test uses; about 0.3 s of CPU in each process
# that imports Hypothesis (the workers, the controller, every `st`).
export HYPOTHESIS_NO_PLUGINS=1

# The tests' temporary files (tmp_path, the SQLite copies every test makes,
# the docs' working directories) go to memory where /dev/shm is a tmpfs with
# room: waiting on SQLite's fsyncs on a shared disk was about a quarter of
# a test-fast worker's busy time (docs/testing.md). A TMPDIR given by the caller is kept.
# pytest removes a passed test's tmp_path at its teardown (pyproject.toml's
# tmp_path_retention_policy), so the run holds little memory; the run's own
# directory goes when it passes, and is named when it fails (what failed kept).
SHM_MIN_FREE_KB=$((4 * 1024 * 1024))
shm_dir=""
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] \
    && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] \
    && [ "$(df -P -k /dev/shm | awk 'NR == 2 { print $4 }')" -ge "$SHM_MIN_FREE_KB" ]; then
    shm_dir="$(mktemp -d /dev/shm/metering-tests.XXXXXX)"
    export TMPDIR="$shm_dir"
fi

# The processes the tests start (workers, `metering` commands) import this
# checkout's code: the venv's editable install may point at another
# checkout (a git worktree shares the main one's venv).
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

status=0
"$root/.venv/bin/python" -m pytest "$@" || status=$?

if [ -n "$shm_dir" ]; then
    if [ "$status" -eq 0 ]; then
        rm -rf "$shm_dir"
    else
        echo "scripts/pytest.sh: the run's temporary files are kept in $shm_dir (in memory)" >&2
    fi
fi

if [ "$status" -eq 5 ]; then
    echo "scripts/pytest.sh: pytest collected no tests (exit 5); treating that as a failure" >&2
    exit 1
fi
exit "$status"
