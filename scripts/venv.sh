#!/usr/bin/env bash
# Makes the project venv at $1 if it has no pip yet, brings its pip up to date
# and installs the project into it editable with the extras $2 (for example
# '.[dev]'), writing no bytecode (docs/testing.md). uv, installed into the venv
# beside pip, does the install: pip took about 29 s of CPU for it, uv about 5.
# Where no uv wheel is to be had, pip installs as before. Where python3 has a
# pip that takes `--python`, the venv is made without one and that pip installs
# the newest pip into it: `python3 -m venv` alone runs ensurepip, which
# installs and compiles the bundled pip only for it to be replaced.
set -euo pipefail

venv="$1"
project="$2"

# pip and uv into the venv with the pip given as arguments; pip alone if uv cannot be had.
tools() {
    "$@" install -q --no-compile --only-binary uv --upgrade pip uv ||
        "$@" install -q --no-compile --upgrade pip
}

if [ -x "$venv/bin/pip" ]; then
    tools "$venv/bin/pip"
elif python3 -m pip install --help 2>/dev/null | grep -q -- '--python '; then
    python3 -m venv --without-pip "$venv"
    tools python3 -m pip --python "$venv/bin/python"
else
    python3 -m venv "$venv"
    tools "$venv/bin/pip"
fi

if [ -x "$venv/bin/uv" ]; then
    exec "$venv/bin/uv" pip install -q --python "$venv/bin/python" -e "$project"
fi
exec "$venv/bin/pip" install -q --no-compile -e "$project"
