"""Times and errors as the console writes them, on a page and in a terminal.

Time is the database's: "expired", "due" and "... ago" compare with ``now()`` of the server
(:func:`db_now`), turned into the ORM's form (:func:`orm_time`) so that it compares with the
times of the rows; a page shows them in its time zone (:func:`shown_time`).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, overload
from uuid import UUID

from django.conf import settings as django_settings
from django.utils import timezone

from ...engines import get_engine


def error_summary(text: str | None, limit: int = 200) -> str | None:
    """The line of an error a person reads first: the last non-empty one of a traceback."""
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else text.strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def db_now() -> datetime:
    """The database clock, in the ORM's form (:func:`orm_time`), so it compares with the
    times of the rows the console reads."""
    return orm_time(get_engine().db_now())


@overload
def orm_time(moment: datetime) -> datetime: ...
@overload
def orm_time(moment: None) -> None: ...
def orm_time(moment: datetime | None) -> datetime | None:
    """``moment`` as the ORM hands out times: aware with ``USE_TZ = True``; naive, in
    ``TIME_ZONE`` (the database session's zone), with ``USE_TZ = False``. The engine's own
    cursor may answer in the other form, and Python refuses to compare the two
    (tests/integration/test_console_time.py runs every page both ways)."""

    if moment is None:
        return None
    zone = timezone.get_default_timezone()
    if django_settings.USE_TZ:
        return moment if timezone.is_aware(moment) else timezone.make_aware(moment, zone)
    return timezone.make_naive(moment, zone) if timezone.is_aware(moment) else moment


def shown_time(moment: datetime | None) -> datetime | None:
    """``moment`` in the time zone a page shows: the current one (Django's ``localtime``) with
    ``USE_TZ``, ``TIME_ZONE`` without; always aware, so a format can name the zone."""

    moment = orm_time(moment)
    if moment is None:
        return None
    if timezone.is_naive(moment):
        return timezone.make_aware(moment, timezone.get_default_timezone())
    return timezone.localtime(moment)


def clock_text(moment: datetime | None) -> str:
    """``2026-12-02 18:58:44 CET``: to the second, in the page's time zone."""
    shown = shown_time(moment)
    return "-" if shown is None else shown.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def seconds_between(start: datetime, end: datetime) -> float:
    """``end - start`` in seconds, whichever form (aware or naive) each comes in."""
    return (orm_time(end) - orm_time(start)).total_seconds()  # type: ignore[operator]


def duration_text(seconds: float | None) -> str:
    """A duration to the second (to the tenth below a minute): ``850 ms``, ``12.3 s``,
    ``4 min 12 s``, ``3 h 12 min``, ``2 d 3 h``. The job page's timings; humanize_seconds
    rounds harder, for "… ago"."""
    if seconds is None or math.isnan(seconds):
        return "-"
    s = abs(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 59.95:
        return f"{s:.1f} s"
    whole = round(s)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def humanize_seconds(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    s = abs(seconds)
    if s < 1:
        text = f"{s * 1000:.0f} ms"
    elif s < 90:
        text = f"{s:.0f} s"
    elif s < 90 * 60:
        text = f"{s / 60:.0f} min"
    elif s < 48 * 3600:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} d"
    return text


def ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    delta = seconds_between(moment, now)
    return f"{humanize_seconds(delta)} ago" if delta >= 0 else f"in {humanize_seconds(delta)}"


def as_uuid(value: Any) -> UUID | None:
    """``value`` as a uuid (a search term, a selected row's id), or None when it is not one."""
    try:
        return UUID(str(value).strip())
    except ValueError:
        return None
