"""Mutation testing of the domain: `make mutants`.

Runs ``mutmut run`` (configured in pyproject's ``[tool.mutmut]``) from a
fresh ``mutants/`` directory, then checks every mutant that the tests did
not kill against ``tests/mutants-equivalent.txt``. Exit status:

* 0: every mutant was killed, or is listed there as equivalent;
* 1: a mutant survived (or no test reached it) and is not listed: its diff
  is printed with a line to paste into the list, if it really is equivalent
  (otherwise, write the test that kills it);
* 2: mutmut itself failed, or the list is malformed.

Each line of the list is ``NAME HASH REASON``: the mutant's name, the first
8 hex digits of a SHA-1 of its changed lines, and one line saying why no
test can tell it from the original. Mutants are numbered within their
function, so an edited function renumbers them: a listed name whose
mutation is no longer the one described (another hash) counts as new.
A listed mutant that is now killed, or gone, only draws a warning.

``--keep`` reuses ``mutants/`` and mutmut's earlier verdicts, testing again
only the mutants of edited functions and the last run's survivors (quick
while writing tests; the check that counts is a fresh run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EQUIVALENT = ROOT / "tests" / "mutants-equivalent.txt"
LOG = MUTANTS / "mutmut-run.log"
DETECTED = {"killed", "timeout", "caught by type check"}
LINE = re.compile(r"^(?P<name>\S+)\s+(?P<hash>[0-9a-f]{8})\s+(?P<reason>\S.*)$")
RESULT = re.compile(r"^\s+(?P<name>\S+): (?P<status>.+)$")


def mutmut(*args: str, capture: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
        text=True,
        check=False,
    )


def read_equivalents() -> dict[str, tuple[str, str]]:
    """name -> (hash, reason) from the list; exits 2 on a malformed line."""
    listed: dict[str, tuple[str, str]] = {}
    for number, raw in enumerate(EQUIVALENT.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        match = LINE.match(text)
        if match is None or match["name"] in listed:
            why = "listed twice" if match else "expected NAME HASH REASON"
            print(f"{EQUIVALENT.relative_to(ROOT)}:{number}: {why}: {text}", file=sys.stderr)
            sys.exit(2)
        listed[match["name"]] = (match["hash"], match["reason"])
    return listed


def statuses() -> dict[str, str]:
    done = mutmut("results", "--all", "true")
    found = {m["name"]: m["status"] for m in map(RESULT.match, done.stdout.splitlines()) if m}
    if done.returncode != 0 or not found:
        print(done.stdout, file=sys.stderr)
        print("scripts/mutants.py: `mutmut results` gave no mutants", file=sys.stderr)
        sys.exit(2)
    return found


def diffs(names: list[str]) -> dict[str, str]:
    """Each mutant's diff, as `mutmut show` prints it (one process for all)."""
    if not names:
        return {}
    script = (
        "import json, sys\n"
        "try:\n"
        "    from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
        "except ImportError:\n"
        "    from mutmut.__main__ import get_diff_for_mutant\n"
        "print(json.dumps({n: get_diff_for_mutant(n) for n in json.load(sys.stdin)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        input=json.dumps(names),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode == 0:
        shown: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
        return shown
    # Another mutmut version: one `mutmut show` each (slower, same text).
    return {name: mutmut("show", name).stdout.split("\n", 1)[-1] for name in names}


def digest(diff: str) -> str:
    """What a mutant changes: its removed and added lines, without context or headers."""
    changed = [
        line[0] + line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return hashlib.sha1("\n".join(changed).encode()).hexdigest()[:8]


def run_mutmut(*names: str) -> bool:
    """`mutmut run` (of ``names`` only, when given), its output in LOG; False if it failed."""
    # Each mutant runs pytest anew: scanning the installed plugins is a good
    # part of that, and the domain's tests use none of them.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with LOG.open("a") as log:
        run = subprocess.run(
            [sys.executable, "-m", "mutmut", "run", *names],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if run.returncode != 0:
        tail = LOG.read_text(errors="replace").replace("\r", "\n").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        print(f"scripts/mutants.py: mutmut run exited {run.returncode}", file=sys.stderr)
    return run.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="reuse mutants/ and earlier results")
    options = parser.parse_args()
    listed = read_equivalents()

    started = time.monotonic()
    if not options.keep:
        shutil.rmtree(MUTANTS, ignore_errors=True)
    MUTANTS.mkdir(exist_ok=True)
    LOG.write_text("")
    print(f"mutmut run (its output: {LOG.relative_to(ROOT)})", flush=True)
    if not run_mutmut():
        return 2
    found = statuses()
    undetected = sorted(name for name, status in found.items() if status not in DETECTED)
    if options.keep and undetected:
        # mutmut keeps a verdict until the mutated function changes: try the
        # survivors again, against the tests as they are now.
        if not run_mutmut(*undetected):
            return 2
        found = statuses()
        undetected = sorted(name for name, status in found.items() if status not in DETECTED)
    seconds = time.monotonic() - started
    shown = diffs(undetected)
    equivalent, new = [], []
    for name in undetected:
        if name in listed and listed[name][0] == digest(shown[name]):
            equivalent.append(name)
        else:
            new.append(name)

    detected = sum(status in DETECTED for status in found.values())
    print(
        f"{len(found)} mutants: {detected} killed, {len(equivalent)} listed as equivalent, "
        f"{len(new)} unexplained; {seconds:.0f} s"
    )
    for name, (_, reason) in sorted(listed.items()):
        if name not in found:
            print(f"warning: listed mutant {name} no longer exists ({reason})")
        elif found[name] in DETECTED:
            print(f"warning: listed mutant {name} is {found[name]} now: remove it from the list")
    if not new:
        return 0

    print(f"\n{len(new)} mutant(s) no test kills, not in {EQUIVALENT.relative_to(ROOT)}:\n")
    for name in new:
        note = ""
        if name in listed:
            note = " (listed, but its mutation changed: its function was edited)"
        print(f"# {name}: {found[name]}{note}")
        print(shown[name].rstrip(), end="\n\n")
    print("Kill each with a test (`.venv/bin/mutmut run NAME` then tries that mutant alone);")
    print("or, if no test could ever tell it from the original, list it with the reason:\n")
    for name in new:
        print(f"{name} {digest(shown[name])} REASON")
    return 1


if __name__ == "__main__":
    sys.exit(main())
