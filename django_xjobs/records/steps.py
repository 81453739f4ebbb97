"""A durable run's steps, its child jobs, and the events it waits for (docs/durable.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from .claims import Claim


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOwner:
    """Whose step writes these are: the job, the claim (fence) and the run (step key)."""

    claim: Claim
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One row of ``x_job_steps``; ``due`` is ``wake_at <= now()`` on the database clock."""

    name: str
    status: str
    output: Any
    attempts: int
    error: str | None
    started_at: datetime | None
    completed_at: datetime | None
    wake_at: datetime | None
    event: str | None
    correlation_key: str | None
    event_id: int | None
    event_published_at: datetime | None
    due: bool = False
    # run, sleep, event, event_any, invoke; None on rows recorded before kinds were.
    kind: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InvokeStep:
    """An invoke or gather step, opened or locked (docs/durable.md, "Child jobs"): its
    children's ids, whether this call opened it, whether its timeout has come, and when the
    parent is claimed again if no child wakes it first."""

    children: list[str]
    opened: bool
    due: bool
    park_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildState:
    """One child of an invoke or gather step as its parent reads it; ``state`` None: the child
    is gone (purged)."""

    id: UUID
    name: str | None
    state: str | None
    result: Any
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedStep:
    """A step that waits: since when, until when, and whether that moment has come."""

    started_at: datetime
    wake_at: datetime
    due: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    """A published event (``x_job_events``), as :func:`~django_xjobs.publish_event` returns it
    and ``manage.py xjobs events`` lists it."""

    id: int
    name: str
    payload: Any
    correlation_key: str | None = None
    published_at: datetime
    expires_at: datetime | None = None
