"""The releases the upgrade test (``tests/upgrade/run.py``) starts from: the one place they are
named. Each is a commit of this repository; its ``django_xjobs`` package is taken from git."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Baseline:
    commit: str
    description: str


BASELINES = {
    "main-2026-12-02": Baseline(
        "0991d42756e27a4621eb667d2595e1ffff064e04",
        "main of 2026-12-02 (one migration, 0001), the code the upgrade figures of issue 29 used",
    ),
    "0.2.0": Baseline(
        "99da1556623262f4c8448156fca73bfa9b20a735",
        "release 0.2.0 (tag v0.2.0), the first release",
    ),
}
# The one the suite's test (tests/acceptance/test_upgrade.py) and a plain run start from: the
# oldest release this version upgrades from in a rolling deploy (0.1.0's last commit, until the
# next minor release makes it 0.2.0). `make upgrade-check` runs every baseline.
DEFAULT = "main-2026-12-02"
