"""How the console's pages show a value: a state as a badge, a JSON column (shortened, with a
link to the whole value), an error preformatted, a time on one line."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .reads.json_columns import JSON_PAGE_CHARS, ShownJson
from .reads.text import shown_time


def badge(value: str) -> str:
    return format_html('<span class="xjobs-badge xjobs-{}">{}</span>', value, value)


def json_block(shown: ShownJson, whole_url: str) -> str:
    """A JSON column on a page: indented (or, when Python cannot decode it, as stored), at most
    :data:`JSON_PAGE_CHARS` characters of it, and a link to the whole value beyond."""
    if shown.text is None:
        return "-"
    notes = []
    if not shown.decoded:
        notes.append(format_html(
            "This value could not be decoded by Python's json module ({}): it is shown as "
            "the database stores it.", shown.problem))
    if shown.truncated:
        notes.append(format_html(
            'Shortened to its first {} of {} characters: <a href="{}">the whole value</a>.',
            f"{JSON_PAGE_CHARS:,}", f"{shown.chars:,}", whole_url))
    elif not shown.decoded:
        notes.append(format_html('<a href="{}">The value as stored</a>.', whole_url))
    note = format_html('<p class="xjobs-note">{}</p>', format_html_join(" ", "{}", (
        (n,) for n in notes))) if notes else ""
    return format_html('<pre class="xjobs-json">{}</pre>{}', shown.text, note)


def preformatted(text: str | None) -> str:
    return format_html('<pre class="xjobs-error">{}</pre>', text) if text else "-"


def short_time(moment: Any) -> str:
    """A time in a list column, short enough for the jobs list to fit 1280 px: ``18:58:44``
    today, ``Dec 02 18:58`` another day this year, ``2025-12-02`` before; the whole moment
    (``2026-12-02 18:58:44 CET``) is its title."""
    shown = shown_time(moment)
    if shown is None:
        return "-"
    today = shown_time(timezone.now())
    assert today is not None
    if shown.date() == today.date():
        text = shown.strftime("%H:%M:%S")
    elif shown.year == today.year:
        text = shown.strftime("%b %d %H:%M")
    else:
        text = shown.strftime("%Y-%m-%d")
    return format_html('<span class="xjobs-time" title="{}">{}</span>',
                       shown.strftime("%Y-%m-%d %H:%M:%S %Z"), text)
