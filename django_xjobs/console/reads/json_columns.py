"""JSON columns as the console reads and shows them, and records as JSON-ready values.

The console reads a JSON column as text and decodes it itself, never through ``JSONField``
(docs/console.md, "Big and undecodable JSON"); ``manage.py xjobs ... --json`` prints what
:func:`as_json` makes of a record or a row.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import TextField
from django.db.models.functions import Cast, Left, Length

from ...records import decode_stored_json

# A page shows at most this many characters of a JSON column and links to the whole value
# beyond: a 512 KiB input rendered whole is a page of megabytes, pretty-printed more. The
# database sends the page this much of the value (plus one character, to tell that there is
# more), never the rest.
JSON_PAGE_CHARS = 10_000
# The JSON columns of each console model: the console reads them as text (with_json_text) and
# decodes them itself (shown_json), never through JSONField, which raises on valid jsonb that
# Python's json cannot load (an integer of more than 4,300 digits, arrays nested thousands
# deep) and would take the page down with it (tests/integration/test_console_rows.py).
JSON_FIELDS: dict[str, tuple[str, ...]] = {
    "job": ("input", "result", "worker_ids"),
    "jobstep": ("output",),
    "jobevent": ("payload",),
    "outboxentry": ("input",),
    "backfill": ("last_cursor", "code_changes"),
}
_TEXT, _CHARS = "_xjobs_text_", "_xjobs_chars_"


def json_fields(model: Any) -> tuple[str, ...]:
    return JSON_FIELDS.get(model._meta.model_name, ())


# Columns no list shows that can be big: a job's attempt history holds up to 21 errors with
# their tracebacks. Left out of every list; a job's page reads it when it shows it (one query).
LIST_DEFERRED: dict[str, tuple[str, ...]] = {"job": ("attempts",)}


def without_json(queryset: Any) -> Any:
    """``queryset`` without its JSON columns: for reads that show none of them (lists, panels),
    which then cost neither the transfer of a big value nor a decode that can fail."""
    return queryset.defer(*json_fields(queryset.model),
                          *LIST_DEFERRED.get(queryset.model._meta.model_name, ()))


def with_json_text(queryset: Any, limit: int | None = JSON_PAGE_CHARS) -> Any:
    """``queryset`` with its JSON columns read as text: the first ``limit`` characters (all of
    them with ``None``) and the length, for :func:`shown_json`. The columns themselves are
    deferred: touching ``obj.input`` would decode it through JSONField."""

    names = json_fields(queryset.model)
    annotations: dict[str, Any] = {}
    for name in names:
        text = Cast(name, TextField())
        annotations[_TEXT + name] = text if limit is None else Left(text, limit + 1)
        annotations[_CHARS + name] = Length(text)
    return queryset.defer(*names).annotate(**annotations)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShownJson:
    """A JSON column as the console shows it.

    ``text`` is what to print: indented JSON when Python could decode the value, else the
    stored text as it is (``problem`` says why it could not be decoded). ``truncated``: only
    the first :data:`JSON_PAGE_CHARS` characters of ``text`` are there; the page links to the
    whole value, which the database serves as stored text (the console decodes nothing to do
    that). ``value`` is the decoded value (whole values only), for ``--json``.
    """

    text: str | None  # None: SQL NULL (a job with no result yet)
    chars: int  # length of the stored text, the whole value
    truncated: bool = False
    problem: str | None = None
    value: Any = None

    @property
    def decoded(self) -> bool:
        return self.problem is None

    def as_json(self) -> Any:
        """The value for ``--json``: itself, or (when Python cannot decode it, or only a part
        was read) a mapping that says so and carries the stored text."""
        if self.text is None:
            return None
        if self.decoded and not self.truncated:
            return self.value
        why = {"undecodable": self.problem} if self.problem else {"truncated": True}
        return {**why, "chars": self.chars, "text": self.text}


def json_text(obj: Any, name: str) -> str | None:
    """Column ``name`` of ``obj`` (read by :func:`with_json_text`) as the database stores it."""
    return getattr(obj, _TEXT + name)  # type: ignore[no-any-return]


def shown_json(obj: Any, name: str, *, limit: int | None = JSON_PAGE_CHARS) -> ShownJson:
    """Column ``name`` of ``obj``, read by :func:`with_json_text`, as a page (or, with
    ``limit=None``, a command) shows it."""

    text = json_text(obj, name)
    chars = getattr(obj, _CHARS + name)
    if text is None:
        return ShownJson(text=None, chars=0)
    if chars > len(text):  # a prefix: not decodable as such, shown as stored
        return ShownJson(text=text[:limit], chars=chars, truncated=True)
    value, problem = decode_stored_json(text)
    if problem is not None:
        cut = limit is not None and len(text) > limit
        return ShownJson(text=text[:limit], chars=chars, truncated=cut, problem=problem)
    try:
        pretty = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):  # loads accepted what dumps refuses: show it stored
        pretty = text
    cut = limit is not None and len(pretty) > limit
    return ShownJson(text=pretty[:limit] if cut else pretty, chars=chars, truncated=cut,
                     value=value)


# ------------------------------------------------------------------------------- JSON form --


def as_json(value: Any) -> Any:
    """Records, model instances and their fields as JSON-ready values (``xjobs ... --json``)."""

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for extra in ("live", "last_seen_at", "dead_ratio", "verdict", "outbox_verdict",
                      "held_back"):
            if hasattr(type(value), extra) and isinstance(getattr(type(value), extra), property):
                out[extra] = as_json(getattr(value, extra))
        return out
    if hasattr(value, "_meta") and hasattr(value, "pk"):  # a model instance
        out = {}
        for f in value._meta.concrete_fields:
            if hasattr(value, _TEXT + f.attname):  # read by with_json_text: never decoded here
                out[f.attname] = shown_json(value, f.attname, limit=None).as_json()
            else:
                out[f.attname] = as_json(getattr(value, f.attname))
        return out
    if isinstance(value, ShownJson):
        return value.as_json()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [as_json(v) for v in items]
    return value
