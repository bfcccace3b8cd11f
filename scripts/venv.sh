#!/usr/bin/env bash
# Makes the project venv at $1 if it has no pip yet, and brings its pip up to
# date, writing no bytecode (docs/testing.md). Where python3 has a pip that
# takes `--python`, the venv is made without one and that pip installs the
# newest pip into it: `python3 -m venv` alone runs ensurepip, which installs
# and compiles the bundled pip only for it to be replaced.
set -euo pipefail

venv="$1"
if [ -x "$venv/bin/pip" ]; then
    exec "$venv/bin/pip" install -q --no-compile --upgrade pip
fi
if python3 -m pip install --help 2>/dev/null | grep -q -- '--python '; then
    python3 -m venv --without-pip "$venv"
    python3 -m pip --python "$venv/bin/python" install -q --no-compile --upgrade pip
else
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-compile --upgrade pip
fi
