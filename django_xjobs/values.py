"""Checks and encodings of plain values, shared by every layer: standard library only.

* names (jobs, queues, events, cron tasks) and bounded text (keys, tenants, reasons);
* durations: settings strings such as ``"30s"``, and the timedelta-or-seconds arguments of the
  API; memory sizes in MiB (``"512MiB"``, ``"1GiB"``);
* JSON as the database stores it (``encode_json``): compact, ``jsonb``-safe, readable back by
  Python, under the payload limit; a datetime, date, time, UUID or Decimal in it is stored as
  a tagged object and read back as itself (``decode_json``; docs/guide.md, "Values: a job's
  input and result");
* errors as a job's row records them (``format_error``, ``record_error``).

Each check raises the error its caller's contract names: :class:`InvalidJobInput` for what is
passed at run time (an enqueue, an event), :class:`ConfigurationError` for what is declared
(``@job`` options, settings). Nothing here imports Django or another module of the package
but :mod:`django_xjobs.exceptions`.
"""

from __future__ import annotations

import json
import math
import re
import sys
import traceback
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from .exceptions import ConfigurationError, InvalidJobInput, PayloadTooLarge, error_class_line

INT32 = 2**31 - 1  # integer columns are PostgreSQL integers
# \Z, not $: `$` also matches before a trailing newline, and "default\n" is not "default".
NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}\Z")

# ---------------------------------------------------------------------------- names, text --


def check_name(kind: str, value: Any, *,
               error: type[Exception] = InvalidJobInput) -> str:
    """``value`` if it is a valid name (1-200 characters from ``[A-Za-z0-9_.:-]``)."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise error(f"{kind} {value!r} is not valid: use 1-200 characters from [A-Za-z0-9_.:-]")
    return value


def check_text(what: str, value: Any, *, max_length: int = 200) -> str:
    """``value`` if it is a non-empty string of at most ``max_length`` characters, without
    NUL (PostgreSQL text cannot hold it) and valid UTF-8 (no lone surrogate)."""
    if not isinstance(value, str) or not value or len(value) > max_length or "\x00" in value:
        raise InvalidJobInput(
            f"{what} must be a non-empty string of at most {max_length} characters without NUL,"
            f" got {value!r:.100}"
        )
    if not is_utf8(value):
        raise InvalidJobInput(f"{what} contains a lone surrogate, which is not valid UTF-8")
    return value


def keyword_input(value: Any, what: str, *,
                  error: type[Exception] = InvalidJobInput) -> Mapping[Any, Any]:
    """A job's input as it is stored: a mapping of keyword arguments (None is no arguments)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(f"{what} must be a dict of keyword arguments, got {type(value).__name__}")
    return value


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (Python strings may hold lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ------------------------------------------------------------------------------- durations --


# The documented grammar (docs/guide.md, "Settings"), and no wider: a number and one unit.
# Django's parse_duration reads HH:MM:SS and ISO 8601 instead; pytimeparse refuses 250ms and a
# bare number; pytimeparse2 also takes 30S, 5m30s and "5 minutes" (tests/unit/test_conf.py).
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(value: Any, *, what: str = "duration") -> float:
    """Seconds from a number, a timedelta or a string like ``"30s"``. Negative is an error."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ConfigurationError(f"{what}: expected a duration, got {value!r}")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ConfigurationError(
                f"{what}: {value!r} is not a duration (use e.g. 250ms, 30s, 5m, 2h, 7d)"
            )
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ConfigurationError(f"{what}: expected a duration, got {value!r}")
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what}: must be a finite duration, got {value!r}")
    if seconds < 0:
        raise ConfigurationError(f"{what}: must not be negative, got {value!r}")
    return seconds


def seconds_of(value: Any, what: str) -> float:
    """Seconds from a timedelta or a number passed to the API (a delay, a ttl, a timeout):
    finite and not negative, else :class:`InvalidJobInput` naming ``what``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidJobInput(f"{what} must be a timedelta or seconds, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidJobInput(f"{what} must not be negative, got {value!r}")
    return seconds


def milliseconds_of(value: Any, what: str) -> int:
    """:func:`seconds_of` in whole milliseconds, as the engine takes durations."""
    return round(seconds_of(value, what) * 1000)


# ---------------------------------------------------------------------------- memory sizes --


# A memory bound in mebibytes (xjobs_worker --max-memory, XJOBS["MAX_MEMORY"]): a bare number
# of MiB, or a number and a binary unit. "MB"/"GB" are refused rather than guessed at: their
# meaning differs between tools (Celery's max_memory_per_child counts KiB).
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(MiB|GiB)?\s*$", re.IGNORECASE)


def parse_mebibytes(value: Any, *, what: str = "memory size") -> int:
    """Whole MiB, at least 1, from an int (MiB) or a string like ``"512"``, ``"512MiB"`` or
    ``"1.5GiB"`` (rounded to the nearest MiB)."""
    if isinstance(value, int) and not isinstance(value, bool):
        mib = float(value)
    elif isinstance(value, str) and (m := _MEMORY_RE.match(value)):
        mib = float(m.group(1)) * (1024 if (m.group(2) or "").lower() == "gib" else 1)
    else:
        raise ConfigurationError(
            f"{what}: {value!r} is not a memory size (MiB: e.g. 512, 512MiB or 1GiB)")
    if not math.isfinite(mib) or round(mib) < 1 or round(mib) > INT32:
        raise ConfigurationError(f"{what}: must be at least 1 MiB, got {value!r}")
    return round(mib)


# ------------------------------------------------------------------------------------ JSON --


# One encoder for every enqueue: json.dumps with any option builds a new JSONEncoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # a \u0000 escape not itself escaped
MAX_DEPTH = 100
# Python reads back from JSON text an integer of at most this many digits, unless the reading
# process raised sys.set_int_max_str_digits(); the worker that decodes a job's input may not have.
READABLE_INT_DIGITS = sys.int_info.default_max_str_digits
_TOO_MANY_DIGITS = 10**READABLE_INT_DIGITS


def encode_json(value: Any, *, what: str, limit: int | None) -> str:
    """Compact JSON text that PostgreSQL ``jsonb`` accepts and :func:`decode_json` reads back,
    typed values as tagged objects (:func:`tagged`), or a clear :class:`InvalidJobInput`
    (:class:`PayloadTooLarge` over ``limit`` bytes)."""
    typed: list[bool] = []
    bad = _first_bad_value(value, typed, what)
    if bad is None and _digit_limit_lifted():
        bad = _first_unreadable_int(value, what)
    if bad:
        raise InvalidJobInput(f"{what} is not JSON-serialisable: {bad}")
    try:
        # The walk found every typed value: a value without one never meets the `default` hook.
        text = (_TYPED_ENCODER if typed else _ENCODER).encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        # An integer past this process's own digit limit (the walks found nothing else).
        bad = _first_unreadable_int(value, what)
        raise InvalidJobInput(f"{what} is not JSON-serialisable: {bad or exc}") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidJobInput(
            f"{what} contains a lone surrogate, which is not valid UTF-8"
        ) from None
    # json.dumps writes a NUL character as the escape \u0000, which jsonb refuses. The six
    # characters backslash-u-0-0-0-0 in a string are written with an escaped backslash: fine.
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidJobInput(f"{what} contains a NUL character, which PostgreSQL cannot store")
    if limit is not None and size > limit:
        raise PayloadTooLarge(
            f"{what} is {size} bytes as JSON, over XJOBS['MAX_PAYLOAD_BYTES'] = {limit}"
        )
    return text


def _first_bad_value(
    value: Any, typed: list[bool], path: str = "input", depth: int = 0,
    seen: set[int] | None = None,
) -> str | None:
    """Where in ``value`` JSON encoding would fail or change the data, naming the field; a
    typed value found on the way is noted in ``typed``.

    ``json.dumps`` alone is not enough: it turns dict keys 1 and "1" into the same string (and
    jsonb then keeps one of them), and a circular structure must be reported, not recursed into.
    """
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} = {value!r} (NaN/Infinity is not JSON)"
    if depth >= MAX_DEPTH:
        return f"{path} is nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, list | tuple | dict):
        seen = seen if seen is not None else set()
        if id(value) in seen:
            return f"{path} contains itself (a circular reference)"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                if TYPED_KEY in value:
                    return (f"{path} has the key {TYPED_KEY!r}, which django-xjobs reserves to "
                            "mark the typed values it stores; rename that key")
                for k, item in value.items():
                    if not isinstance(k, str):
                        return f"{path} has a non-string key {k!r} (JSON object keys are strings)"
                    bad = _first_bad_value(item, typed, f"{path}[{k!r}]", depth + 1, seen)
                    if bad:
                        return bad
            else:
                for i, item in enumerate(value):
                    bad = _first_bad_value(item, typed, f"{path}[{i}]", depth + 1, seen)
                    if bad:
                        return bad
        finally:
            seen.discard(id(value))
        return None
    if isinstance(value, TYPED_TYPES):
        if not typed:
            typed.append(True)
        return None
    return f"{path} is a {type(value).__name__} ({safe_repr(value):.60}); {ACCEPTED}"


def _digit_limit_lifted() -> bool:
    """Whether this process encodes integers that a process with the default limit cannot
    read back (``sys.set_int_max_str_digits(0)`` or above the default)."""
    limit = sys.get_int_max_str_digits()
    return limit == 0 or limit > READABLE_INT_DIGITS


def _first_unreadable_int(value: Any, path: str) -> str | None:
    """Where ``value`` holds an integer of more digits than Python's json module reads back by
    default (the worker's decode would refuse the row). Walked only when this process lifted
    the limit, or its encoder refused an integer: never on the usual enqueue."""
    if isinstance(value, int):
        if -_TOO_MANY_DIGITS < value < _TOO_MANY_DIGITS:
            return None
        return (f"{path} is an integer of more than {READABLE_INT_DIGITS} digits, which "
                "Python's json module does not read back (sys.get_int_max_str_digits())")
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for k, item in items:
        bad = _first_unreadable_int(item, f"{path}[{k!r}]")
        if bad:
            return bad
    return None


# ------------------------------------------------------------------------------ typed JSON --


# A typed value is stored as an object marked by this key (docs/guide.md, "Values: a job's input
# and result"): {"$xjobs": "decimal", "value": "1.10"}. encode_json refuses a dict of the
# caller's with this key, so every object that has it in stored JSON is one of ours
# (tests/unit/test_typed_values.py pins the forms and the refusal).
TYPED_KEY = "$xjobs"
# The key as JSON text: how decode_json tells, with one scan of the text, whether the object hook
# is needed (jsonb writes the key back exactly so: it escapes none of its characters).
_TYPED_MARK = f'"{TYPED_KEY}"'
TYPED_TYPES = (datetime, date, time, UUID, Decimal)  # datetime first: it is a date
ACCEPTED = ("a value may be a dict (string keys), list, tuple, str, int, float, bool, None, "
            "datetime, date, time, uuid.UUID or decimal.Decimal")
_TAG_FIELDS = frozenset({TYPED_KEY, "value", "zone", "fold"})


def tagged(value: Any) -> dict[str, Any]:
    """The stored form of a typed value (the encoder's ``default``). Subclasses are stored as
    their base class: the methods called are the base class's own.

    * ``datetime`` / ``time``: ``isoformat()``, with the UTC offset when aware; a
      ``zoneinfo.ZoneInfo`` zone is kept by its key (``"zone"``), and ``fold=1`` as ``"fold"``.
    * ``date``: ``isoformat()``; ``UUID``: its hyphenated form; ``Decimal``: ``str()``, which
      keeps every digit and the exponent (``Decimal("1.10")`` stays ``"1.10"``).
    """
    if isinstance(value, datetime):
        return _clock_tag("datetime", datetime.isoformat(value), value.tzinfo, value.fold)
    if isinstance(value, date):
        return {TYPED_KEY: "date", "value": date.isoformat(value)}
    if isinstance(value, time):
        return _clock_tag("time", time.isoformat(value), value.tzinfo, value.fold)
    if isinstance(value, UUID):
        return {TYPED_KEY: "uuid", "value": UUID.__str__(value)}
    if isinstance(value, Decimal):
        return {TYPED_KEY: "decimal", "value": Decimal.__str__(value)}
    raise TypeError(f"{type(value).__name__} is not a typed value; {ACCEPTED}")


def _clock_tag(kind: str, text: str, tz: Any, fold: int) -> dict[str, Any]:
    tag: dict[str, Any] = {TYPED_KEY: kind, "value": text}
    if isinstance(tz, ZoneInfo) and tz.key is not None:
        tag["zone"] = tz.key
    if fold:
        tag["fold"] = 1
    return tag


def decode_json(text: str) -> Any:
    """JSON text as :func:`encode_json` wrote it or ``jsonb`` gives it back, its typed values as
    Python's. Raises as ``json.loads`` does (ValueError, RecursionError), and ValueError for a
    marked object that is not a typed value this release knows. Text without the mark is plain
    ``json.loads``: no object hook on the hot path of a plain input."""
    if _TYPED_MARK in text:
        return _TYPED_DECODER.decode(text)
    return json.loads(text)


def _untag(obj: dict[str, Any]) -> Any:
    """The object hook of :func:`decode_json`: a marked object as the value it stores."""
    if TYPED_KEY not in obj:
        return obj
    kind, text = obj[TYPED_KEY], obj.get("value")
    zone, fold = obj.get("zone"), obj.get("fold", 0)
    clock = kind == "datetime" or kind == "time"
    if not (isinstance(text, str) and obj.keys() <= _TAG_FIELDS
            and (zone is None or (clock and isinstance(zone, str)))
            and (fold == 0 or (clock and fold == 1)) and type(fold) is int):
        raise ValueError(f"malformed typed value {safe_repr(obj):.120}")
    try:
        if clock:
            value = datetime.fromisoformat(text) if kind == "datetime" else time.fromisoformat(text)
            if zone is not None:  # the wall time in its zone, as pickle brings one back
                return value.replace(tzinfo=ZoneInfo(zone), fold=fold)
            return value.replace(fold=1) if fold else value
        if kind == "date":
            return date.fromisoformat(text)
        if kind == "uuid":
            return UUID(text)
        if kind == "decimal":
            return Decimal(text)
    # ZoneInfo raises ZoneInfoNotFoundError (a KeyError), or an OSError for a key that names no
    # file of the tz database (a directory, a name too long).
    except (ValueError, InvalidOperation, KeyError, OSError) as exc:
        why = "not a number" if isinstance(exc, InvalidOperation) else exc
        raise ValueError(f"typed value {safe_repr(obj):.120} cannot be read: {why}") from None
    raise ValueError(f"typed value {safe_repr(obj):.120} is of a type this release does not "
                     "know (written by a newer django-xjobs?)")


_TYPED_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                                  default=tagged)
_TYPED_DECODER = json.JSONDecoder(object_hook=_untag)


def safe_repr(value: Any) -> str:
    """repr() for an error message, which must not itself fail (a model whose __str__ reads a
    deleted row, a proxy to a closed resource)."""
    try:
        return repr(value)
    except Exception as exc:
        return f"<{type(value).__name__} whose repr() raised {type(exc).__name__}>"


# ---------------------------------------------------------------------------------- errors --


MAX_ERROR_CHARS = 8000


def format_error(exc: BaseException) -> str:
    """An exception's traceback as ``traceback`` formats it, cut in the middle past
    ``MAX_ERROR_CHARS`` (the start and the end of a traceback say the most)."""
    return _cut("".join(traceback.format_exception(exc)).rstrip())


def record_error(exc: BaseException) -> str:
    """The error recorded for an exception raised by a job's code: its class on the first line,
    read back by the ``django.tasks`` backend (tests/unit/test_django_tasks_mapping.py), then
    its traceback unchanged, final newline included, as Django's task backends keep it."""
    return f"{error_class_line(exc)}\n{_cut(''.join(traceback.format_exception(exc)))}"


def error_line(text: str | None) -> str | None:
    """The line of a recorded error a person reads first: the last non-empty line of its
    traceback, the exception and its message (None for no error)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


def _cut(text: str) -> str:
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n[... traceback truncated ...]\n" + text[
            -MAX_ERROR_CHARS // 2 :
        ]
    return text
