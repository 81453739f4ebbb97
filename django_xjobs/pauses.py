"""Pauses of queues and keys (docs/flow-control.md, "Pause and circuit breakers").

    from django_xjobs import pause_queue, resume_queue, pause_key, resume_key, pauses

    pause_queue("emails", until=datetime(2026, 12, 1, 2, tzinfo=UTC), reason="migration")
    pause_key("partner:acme", for_=timedelta(minutes=10), reason="429 from partner")
    resume_key("partner:acme")      # the jobs blocked on it are handed back at once

A paused queue is not claimed from; a paused key holds back every job whose concurrency or
rate-limit key it is. Both are rows of ``x_flow_pauses`` that the claim reads, so a pause takes
effect at every worker's next claim, and running jobs finish. A job raises
:class:`~django_xjobs.exceptions.PauseKey` to pause a key itself (a circuit breaker).

Every argument is checked before anything is written; a bad one raises
:class:`~django_xjobs.exceptions.InvalidJobInput`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .engines import get_engine
from .exceptions import MAX_PAUSE_KEY, ConfigurationError, InvalidJobInput
from .records import PauseRecord
from .values import check_name, check_text, milliseconds_of, parse_duration

# The longest reason stored with a pause (what an operator reads on the console, not a log).
MAX_REASON = 1000


def pause_queue(queue: str, *, until: datetime | None = None,
                reason: str | None = None) -> PauseRecord:
    """Stop claiming from ``queue`` until ``until`` (an aware datetime in the future), or until
    :func:`resume_queue` when None. Pausing a paused queue changes its end and reason."""
    return pause("queue", queue, until=until, reason=reason)


def resume_queue(queue: str) -> bool:
    """End the pause of ``queue`` and wake its workers; whether it was paused."""
    check_name("queue", queue)
    return get_engine().pause_resume_queue(queue)


def pause_key(key: str, *, until: datetime | None = None, for_: timedelta | None = None,
              reason: str | None = None) -> PauseRecord:
    """Hold back every job whose concurrency or rate-limit key is ``key`` until ``until``, for
    ``for_``, or (neither given) until :func:`resume_key`. Not both. Pausing a paused key
    changes its end and reason."""
    return pause("key", key, until=until, for_=for_, reason=reason)


def resume_key(key: str) -> tuple[bool, int]:
    """End the pause of ``key`` and, in the same statement, hand back every job blocked on it
    (``ready``, or ``suspended`` for one blocked while resuming); whether it was paused, and
    how many jobs were handed back."""
    check_key(key)
    return get_engine().pause_resume_key(key)


def pauses(*, kind: str | None = None, limit: int = 1000) -> list[PauseRecord]:
    """The pauses in force, queues then keys (``kind``: only ``"queue"`` or ``"key"``)."""
    if kind not in (None, "queue", "key"):
        raise InvalidJobInput(f"kind must be 'queue', 'key' or None, got {kind!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidJobInput(f"limit must be a positive integer, got {limit!r}")
    return get_engine().pauses_list(kind=kind, limit=limit)


def check_target(kind: Any, name: Any) -> str:
    """``name`` if it is a valid name of a ``kind`` (``"queue"`` or ``"key"``)."""
    if kind == "queue":
        return check_name("queue", name)
    if kind == "key":
        return check_key(name)
    raise InvalidJobInput(f"kind must be 'queue' or 'key', got {kind!r}")


def check_key(key: Any) -> str:
    """A key as pauses name it: a concurrency or rate-limit key as stored (a non-empty string
    of at most 500 characters, valid UTF-8, without NUL)."""
    return check_text("key", key, max_length=MAX_PAUSE_KEY)


def pause(kind: str, name: str, *, until: datetime | None = None,
          for_: timedelta | None = None, reason: str | None = None) -> PauseRecord:
    """Pause a queue (``kind="queue"``) or a key (``kind="key"``): :func:`pause_queue` and
    :func:`pause_key`, and ``xjobs pause QUEUE --for 30m``, whose end the database computes
    from its own clock like a key's."""
    check_target(kind, name)
    if until is not None and for_ is not None:
        raise InvalidJobInput("give until or for_, not both")
    if until is not None:
        if not isinstance(until, datetime):
            raise InvalidJobInput(f"until must be an aware datetime, got {until!r}")
        if until.tzinfo is None or until.utcoffset() is None:
            raise InvalidJobInput(f"until must be an aware datetime (with a time zone), got the "
                                  f"naive {until.isoformat()}")
    for_ms = None
    if for_ is not None:
        if not isinstance(for_, timedelta):
            raise InvalidJobInput(f"for_ must be a timedelta, got {for_!r}")
        for_ms = milliseconds_of(for_, "for_")
        if for_ms <= 0:
            raise InvalidJobInput(f"for_ must be a positive duration, got {for_!r}")
    if reason is not None:
        check_text("reason", reason, max_length=MAX_REASON)
    record = get_engine().pause_upsert(kind, name, until=until, for_ms=for_ms, reason=reason)
    if record is None:
        raise InvalidJobInput(f"until {until.isoformat() if until else until} is not in the "
                              "future (on the database clock): nothing was paused")
    return record


def parse_length(value: Any, *, what: str) -> float:
    """A pause's length typed by a person (``30m``, ``2h``): seconds, more than zero;
    :class:`ConfigurationError` naming ``what`` otherwise (the command and the console)."""
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise ConfigurationError(f"{what}: must be more than zero, got {value!r}")
    return seconds


def describe(record: PauseRecord, *, when: str = "%Y-%m-%dT%H:%M:%S%z") -> str:
    """``until <when> (migration)``, ``until resumed``: a pause for people."""
    until = f"until {record.until.strftime(when).rstrip()}" if record.until else "until resumed"
    return until + (f" ({record.reason})" if record.reason else "")
