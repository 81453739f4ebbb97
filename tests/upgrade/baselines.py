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
}
DEFAULT = "main-2026-12-02"
