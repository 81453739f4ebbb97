"""Old and new versions side by side (docs/deployment.md, "Mixed versions").

During a rolling deploy the old and the new version's processes share the tables: web
processes enqueue, workers claim and settle, operators act, each with the code it was started
with. The rule that keeps them safe together:

    A version writes a new state, table or statement shape only once every process that shares
    the tables can read it.

A release that adds such a write names it in :data:`HELD_BACK` with the first series that reads
it. The database records the oldest series still allowed to run (``x_fleet``, written by the
migration that upgrades tables an earlier version used); while it is older than a write's
series, the write is held back and the version behaves as that series did. ``manage.py xjobs
fleet --finish-upgrade`` clears it once no older process runs; ``--compatible-with 0.1`` sets
it again before a rollback. What each release reads and writes is in CHANGELOG.md's Upgrading
section.
"""

from __future__ import annotations

import re

from .conf import VERSION
from .records import FleetRecord

# This version's release series: what a newer version's HELD_BACK compares with.
SERIES = ".".join(VERSION.split(".")[:2])

# The series a fleet may be kept compatible with: the releases whose readers this version knows.
KNOWN_SERIES = ("0.1",)

# What this version writes that an older series cannot read: the first series that reads it,
# and what the version does instead while the fleet is kept compatible with an older one.
HELD_BACK: dict[str, tuple[str, str]] = {
    "blocked": ("0.2", "a job the claim holds back (no free slot, a paused key) is not parked in "
                       "`blocked`: it stays due, tried again a poll interval later (0.1's enqueue, "
                       "relay and operator paths know four live states)"),
    "history": ("0.2", "finished jobs stay in x_jobs: none is moved into the history tables "
                       "(0.1's retry of a job moved there breaks that table's CHECK)"),
}

_SERIES_RE = re.compile(r"^(\d+)\.(\d+)$")


def _key(series: str) -> tuple[int, int]:
    match = _SERIES_RE.match(series)
    if match is None:
        raise ValueError(f"{series!r} is not a release series: write major.minor, e.g. 0.1")
    return int(match.group(1)), int(match.group(2))


def parse_series(text: str) -> str:
    """``text`` as a series this version can stay compatible with; ValueError, saying which it
    can, for anything else (a version like ``0.1.3`` is taken as its series ``0.1``)."""
    series = ".".join(text.strip().split(".")[:2])
    _key(series)  # the format first, so the message says what is wrong
    if series not in KNOWN_SERIES:
        raise ValueError(f"this version ({VERSION}) cannot stay compatible with {text!r}: it "
                         f"knows {', '.join(KNOWN_SERIES)} (a series newer than {SERIES} needs "
                         "no compatibility from it)")
    return series


def older(version: str) -> bool:
    """Whether a process reporting ``version`` (x_workers.version) runs a series older than
    this one's; one that reports none, or no number, predates the column: older."""
    try:
        return _key(".".join(version.split(".")[:2])) < _key(SERIES)
    except ValueError:
        return True


def writes(feature: str, record: FleetRecord) -> bool:
    """Whether this version may write ``feature`` (a key of :data:`HELD_BACK`) in a fleet whose
    compatibility is ``record``."""
    first_reader, _instead = HELD_BACK[feature]
    return record.compatible_with is None or _key(record.compatible_with) >= _key(first_reader)


def held_back(record: FleetRecord) -> list[str]:
    """What this version holds back in a fleet whose compatibility is ``record``, in words."""
    return [instead for feature, (_series, instead) in HELD_BACK.items()
            if not writes(feature, record)]
