"""What an engine can do, declared once per engine (as Django's ``features.py`` for a database
backend): tests skip by these flags and services branch on them, never on the vendor."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Features:
    """What an engine can do. Tests and services branch on these, never on the vendor."""

    skip_locked: bool = False  # concurrent claims never block each other
    listen_notify: bool = False  # wake-ups pushed by the database on commit
    transactional_enqueue: bool = True  # enqueue joins the caller's transaction
    advisory_locks: bool = False
