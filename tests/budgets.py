"""How many examples the slow property tests run, by Hypothesis profile.

A slow Hypothesis or schemathesis test writes its thorough budget at the
test: ``max_examples=examples(60)``. The default profile (``make test``;
``ci`` when CI is set) runs half of it, at least 5 examples (a schemathesis
run a quarter: `cases`). The differentials (and the tests on their
settings), the limits state machine and the API's schema runs are
derandomized: the same examples every run (the differential's coverage
checks hold by an explicit example); the others draw anew each run. ``make
test-thorough`` (``--hypothesis-profile thorough``) runs the whole budget:
run it after a change to the engine's paths, the storage of a model's
subject or the API's schema (docs/testing.md).
"""

from __future__ import annotations

import math

from hypothesis import settings

THOROUGH = "thorough"
CI_SHARE = 0.5
CI_FLOOR = 5
CASES_SHARE = 0.25


def profile() -> str:
    """The profile Hypothesis loaded: ``--hypothesis-profile``, or ``ci`` when
    the environment says CI (Hypothesis's own choice), else ``default``."""
    return settings.get_current_profile_name()


def examples(thorough: int, share: float = CI_SHARE) -> int:
    """``thorough`` under the thorough profile; else ``share`` of it, at least `CI_FLOOR`."""
    if profile() == THOROUGH:
        return thorough
    return min(thorough, max(CI_FLOOR, math.ceil(thorough * share)))


def cases(thorough: int) -> int:
    """A schemathesis run's examples per operation and mode: `examples` at
    `CASES_SHARE`. Its claim is per operation (every operation, valid and
    invalid input, no 5xx, a documented answer), which fewer cases still
    make; drawing them is most of the run's time."""
    return examples(thorough, CASES_SHARE)
