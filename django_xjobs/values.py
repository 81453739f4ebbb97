"""Checks and encodings of plain values, shared by every layer: standard library only.

* names (jobs, queues, events, cron tasks) and bounded text (keys, tenants, reasons);
* durations: settings strings such as ``"30s"``, and the timedelta-or-seconds arguments of the
  API;
* JSON as the database stores it (``encode_json``): compact, ``jsonb``-safe, readable back by
  Python, under the payload limit;
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
from datetime import timedelta
from typing import Any

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
    """Compact JSON text that PostgreSQL ``jsonb`` accepts and Python reads back, or a clear
    :class:`InvalidJobInput` (:class:`PayloadTooLarge` over ``limit`` bytes)."""
    bad = _first_bad_value(value, what)
    if bad is None and _digit_limit_lifted():
        bad = _first_unreadable_int(value, what)
    if bad:
        raise InvalidJobInput(f"{what} is not JSON-serialisable: {bad}")
    try:
        text = _ENCODER.encode(value)
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
    value: Any, path: str = "input", depth: int = 0, seen: set[int] | None = None
) -> str | None:
    """Where in ``value`` JSON encoding would fail or change the data, naming the field.

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
                for k, item in value.items():
                    if not isinstance(k, str):
                        return f"{path} has a non-string key {k!r} (JSON object keys are strings)"
                    bad = _first_bad_value(item, f"{path}[{k!r}]", depth + 1, seen)
                    if bad:
                        return bad
            else:
                for i, item in enumerate(value):
                    bad = _first_bad_value(item, f"{path}[{i}]", depth + 1, seen)
                    if bad:
                        return bad
        finally:
            seen.discard(id(value))
        return None
    return f"{path} is a {type(value).__name__} ({safe_repr(value):.60})"


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


def _cut(text: str) -> str:
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n[... traceback truncated ...]\n" + text[
            -MAX_ERROR_CHARS // 2 :
        ]
    return text
