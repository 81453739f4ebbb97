"""Records that cross the engine seam: frozen, slotted, keyword-only dataclasses.

Engines decode rows into these and services pass these to engines; no dicts and no ORM model
instances travel across ``engines.base``. Standard library only.

One module per family of the engine's operations; this package is their face, and the place to
import a record from (``from django_xjobs.records import ClaimedJob``), so that a record can move
between modules without its importers noticing:

==============  ===========================================================================
``ids``         job and run ids (UUIDv7)
``states``      a job's states and the groups of them
``enqueue``     what an enqueue sends and answers
``jobs``        a whole job row: its attempt history, its progress, why it is not running
``claims``      a worker's claims and the fenced writes of its runs
``steps``       a durable run's steps, children and events
``operations``  queue figures, counters, the answer of an operator's action
``backfills``   a backfill's passes
``outbox``      jobs staged by ``enqueue_on_commit``
``ratelimits``  the spending of a rate-limit budget
``why``         why a job is not running
``slots``       concurrency slots
``workers``     worker processes, why one is stalled, the fleet's compatibility
``pauses``      pauses of queues and keys
``scheduler``   the scheduler's leader, watermarks and cron runs
``console``     the catalog figures of the operations console
==============  ===========================================================================

``jobs.blocked_by_reader`` is not re-exported: it is a hook django_xjobs/__init__.py sets on
that module, where :class:`JobRecord` reads it.
"""

from __future__ import annotations

from .backfills import BACKFILL_STATUSES, BackfillRecord
from .claims import (
    Claim,
    ClaimBatch,
    ClaimedJob,
    ClaimFloors,
    ClaimFlow,
    ClaimScans,
    Completion,
    DueScan,
    Failure,
    Fence,
    FenceReport,
    Renewal,
    Requeue,
    Suspension,
    UnknownGiveBack,
    UnknownWait,
)
from .console import HistoryTable, TableHealth, XminHolder
from .enqueue import UNIQUE_FOREVER, EnqueueParams, EnqueueResult, JobSpec
from .ids import new_id, new_ids, run_ids_for
from .jobs import (
    ATTEMPT_OUTCOMES,
    AttemptRecord,
    JobRecord,
    ProgressRecord,
    attempt_history,
    decode_stored_json,
    progress_from_json,
)
from .operations import (
    HISTOGRAM_BOUNDS_MS,
    ChangeResult,
    Counters,
    QueueDepth,
    QueueStats,
    Reopened,
    ResumeResult,
)
from .outbox import OutboxRow, OutboxStatus
from .pauses import KeyPauseRequeue, PauseRecord
from .ratelimits import RateRequest
from .scheduler import CronRun, LeaderFence, LeaderRecord, LockedStates, SchedulerStateRecord
from .slots import HandOver, SlotHold, SlotRecord, SlotRelease, SlotRequest, SlotUsage
from .states import ALL_STATES, LIVE_STATES, TERMINAL_STATES, WAITING_STATES, JobState, JobStateName
from .steps import ChildState, EventRecord, InvokeStep, ParkedStep, RunOwner, StepRecord
from .why import BLOCKED_KINDS, BlockedBy, BlockedKind, FlowFacts, RateWindow
from .workers import DEFAULT_MAX_STALL, FleetRecord, WorkerRecord, span, stall_reason

__all__ = [
    "ALL_STATES",
    "ATTEMPT_OUTCOMES",
    "BACKFILL_STATUSES",
    "BLOCKED_KINDS",
    "DEFAULT_MAX_STALL",
    "HISTOGRAM_BOUNDS_MS",
    "LIVE_STATES",
    "TERMINAL_STATES",
    "UNIQUE_FOREVER",
    "WAITING_STATES",
    "AttemptRecord",
    "BackfillRecord",
    "BlockedBy",
    "BlockedKind",
    "ChangeResult",
    "ChildState",
    "Claim",
    "ClaimBatch",
    "ClaimFloors",
    "ClaimFlow",
    "ClaimScans",
    "ClaimedJob",
    "Completion",
    "Counters",
    "CronRun",
    "DueScan",
    "EnqueueParams",
    "EnqueueResult",
    "EventRecord",
    "Failure",
    "Fence",
    "FenceReport",
    "FleetRecord",
    "FlowFacts",
    "HandOver",
    "HistoryTable",
    "InvokeStep",
    "JobRecord",
    "JobSpec",
    "JobState",
    "JobStateName",
    "KeyPauseRequeue",
    "LeaderFence",
    "LeaderRecord",
    "LockedStates",
    "OutboxRow",
    "OutboxStatus",
    "ParkedStep",
    "PauseRecord",
    "ProgressRecord",
    "QueueDepth",
    "QueueStats",
    "RateRequest",
    "RateWindow",
    "Renewal",
    "Reopened",
    "Requeue",
    "ResumeResult",
    "RunOwner",
    "SchedulerStateRecord",
    "SlotHold",
    "SlotRecord",
    "SlotRelease",
    "SlotRequest",
    "SlotUsage",
    "StepRecord",
    "Suspension",
    "TableHealth",
    "UnknownGiveBack",
    "UnknownWait",
    "WorkerRecord",
    "XminHolder",
    "attempt_history",
    "decode_stored_json",
    "new_id",
    "new_ids",
    "progress_from_json",
    "run_ids_for",
    "span",
    "stall_reason",
]
