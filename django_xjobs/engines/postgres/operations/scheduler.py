"""The scheduler (django_xjobs/scheduler/, docs/scheduling.md): leader election by lease or
by session advisory lock, the cron tasks' watermarks, fenced on still leading, and a cron
task's live runs, which its overlap policy reads and acts on inside the round's transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ....records import CronRun, LeaderFence, LeaderRecord, LockedStates, SchedulerStateRecord
from ...base import AdvisorySession
from ..core import PostgresCore
from ..sessions import PostgresAdvisorySession, advisory_key
from ..statements.scheduler import (
    CRON_RUNS_HOLD,
    CRON_RUNS_LIVE,
    CRON_RUNS_LOCK_LIVE,
    CRON_RUNS_RELEASE,
    LEADER_ADVISORY_HOLDER,
    LEADER_ATTEMPT_ELECT,
    LEADER_GET,
    LEADER_RESIGN,
    SCHEDULER_STATE_SET_PAUSED,
    SCHEDULER_STATES_ENSURE,
    SCHEDULER_STATES_LIST,
    SCHEDULER_STATES_LOCK_IF_LEADING,
    SCHEDULER_STATES_MARK_IF_LEADING,
    SCHEDULER_STATES_NOTE_SKIPS_IF_LEADING,
)


def _leader_fence(fence: LeaderFence) -> dict[str, Any]:
    return {"lock_key": fence.lock_key, "holder": fence.holder,
            "margin_ms": fence.margin_ms, "advisory_pid": fence.advisory_pid,
            **advisory_key(fence.lock_key)}


class Scheduler(PostgresCore):
    """The seam's scheduler and cron-overlap operations."""

    def leader_attempt_elect(self, lock_key: str, holder: str, lease_ms: int) -> datetime | None:
        row = self._run(LEADER_ATTEMPT_ELECT, {
            "lock_key": lock_key, "holder": holder, "lease_ms": lease_ms,
        }, fetch="one")
        return row[0] if row is not None else None

    def leader_resign(self, lock_key: str, holder: str) -> bool:
        return bool(self._run(LEADER_RESIGN, {"lock_key": lock_key, "holder": holder},
                              fetch="count"))

    def leader_get(self, lock_key: str) -> LeaderRecord | None:
        row = self._run(LEADER_GET, {"lock_key": lock_key}, fetch="one")
        if row is None:
            return None
        return LeaderRecord(lock_key=row[0], mode="lease", holder=row[1], expires_at=row[2],
                            live=bool(row[3]))

    def leader_advisory_session(self, lock_key: str, label: str) -> AdvisorySession:
        return PostgresAdvisorySession(self.listen_alias, lock_key, label)

    def leader_advisory_holder(self, lock_key: str) -> LeaderRecord | None:
        row = self._run(LEADER_ADVISORY_HOLDER, advisory_key(lock_key), fetch="one")
        if row is None:
            return None
        return LeaderRecord(lock_key=lock_key, mode="advisory", holder=row[1] or f"pid {row[0]}",
                            pid=row[0])

    def scheduler_states_ensure(self, names: Sequence[str], at: datetime,
                                fence: LeaderFence) -> int:
        if not names:
            return 0
        return int(self._run(SCHEDULER_STATES_ENSURE, {
            "names": list(names), "at": at, **_leader_fence(fence),
        }, fetch="count"))

    def scheduler_states_lock_if_leading(self, names: Sequence[str],
                                         fence: LeaderFence) -> LockedStates:
        rows = self._run(SCHEDULER_STATES_LOCK_IF_LEADING, {
            "names": list(names), **_leader_fence(fence),
        })
        locked = [r for r in rows if r[1] is not None]
        return LockedStates(leading=bool(rows[0][0]),
                            watermarks={r[1]: r[2] for r in locked},
                            paused=frozenset(r[1] for r in locked if r[3]))

    def scheduler_states_mark_if_leading(self, names: Sequence[str], at: datetime,
                                         fence: LeaderFence) -> dict[str, datetime]:
        if not names:
            return {}
        return dict(self._run(SCHEDULER_STATES_MARK_IF_LEADING, {
            "names": list(names), "at": at, **_leader_fence(fence),
        }))

    def scheduler_states_list(self) -> list[SchedulerStateRecord]:
        return [
            SchedulerStateRecord(task_name=r[0], last_fired_at=r[1], paused=r[2],
                                 updated_at=r[3], overlap_skipped=r[4],
                                 overlap_skipped_at=r[5])
            for r in self._run(SCHEDULER_STATES_LIST, {})
        ]

    def scheduler_state_set_paused(self, name: str, paused: bool) -> SchedulerStateRecord:
        r = self._run(SCHEDULER_STATE_SET_PAUSED, {"name": name, "paused": paused},
                      fetch="one")
        return SchedulerStateRecord(task_name=r[0], last_fired_at=r[1], paused=r[2],
                                    updated_at=r[3])

    # docs/scheduling.md, "Overlap"; the scheduler round calls these inside its transaction.
    def cron_runs_live(self, enqueued_by: Sequence[str], *, lock: bool) -> list[CronRun]:
        if not enqueued_by:
            return []
        stmt = CRON_RUNS_LOCK_LIVE if lock else CRON_RUNS_LIVE
        return [CronRun(enqueued_by=r[0], id=r[1], state=r[2], blocked_on=r[3], held=r[4])
                for r in self._run(stmt, {"enqueued_by": list(enqueued_by)})]

    def cron_runs_release(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            return []
        return [r[0] for r in self._run(CRON_RUNS_RELEASE, {"ids": [str(i) for i in ids]})]

    def cron_runs_hold(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            return []
        return [r[0] for r in self._run(CRON_RUNS_HOLD, {"ids": [str(i) for i in ids]})]

    def scheduler_states_note_skips_if_leading(
        self, skips: Mapping[str, tuple[int, datetime]], fence: LeaderFence
    ) -> list[str]:
        if not skips:
            return []
        names = list(skips)
        return [r[0] for r in self._run(SCHEDULER_STATES_NOTE_SKIPS_IF_LEADING, {
            "names": names, "counts": [skips[n][0] for n in names],
            "ats": [skips[n][1] for n in names], **_leader_fence(fence),
        })]
