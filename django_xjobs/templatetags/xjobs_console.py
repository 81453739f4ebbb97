"""Template filters of the operations console: times relative to the database clock, sizes,
state badges."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils.html import format_html

from .. import console

register = template.Library()


@register.filter
def ago(moment: datetime | None, now: datetime) -> str:
    """``{{ job.finished_at|ago:db_now }}`` -> "3 min ago" / "in 20 s" / "never"."""
    return console.ago(moment, now)


@register.filter
def seconds(value: float | None) -> str:
    return console.humanize_seconds(value)


@register.filter
def thousands(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else ("-" if value is None else str(value))


@register.filter
def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


@register.filter
def share(part: int | None, whole: int | None) -> str:
    if not part or not whole:
        return "0%"
    return f"{part / whole:.0%}"


@register.filter
def filesize(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


@register.filter
def badge(value: str) -> str:
    return format_html('<span class="xjobs-badge xjobs-{}">{}</span>', value, value)
