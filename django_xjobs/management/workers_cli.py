"""The worker processes of ``x_workers`` in ``manage.py xjobs`` (docs/observability.md, "Workers
and health probes"):

    manage.py xjobs workers [--max-stall 5m]     each worker seen in the last day: what its
                                                 heartbeat reports, and whether it is stalled
    manage.py xjobs health [--queue Q ...] [--max-stall 5m]
                                                 exit 0 when no worker is stalled and every
                                                 queue has one that is not; 1 with the reasons;
                                                 3 when the database cannot be reached

``health`` also prints the console's health panel (management/console_cli.py) after its
verdict; only the verdict decides the exit status, so it serves as a Kubernetes exec probe.
A database that cannot be reached is not a verdict on the workers (they wait for it, and
their loops keep going round): one line on stderr and an exit status of its own, so that an
alert can tell an outage from a fleet that needs attention.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.management.base import CommandError

from .. import conf, registry
from ..console.reads import json_columns
from ..console.reads.health import BAD
from ..console.reads.text import ago, db_now
from ..engines import get_engine
from ..exceptions import ConfigurationError
from ..records import DEFAULT_MAX_STALL, WorkerRecord, span
from ..values import NAME_RE, parse_duration

# The exit status of `xjobs health` (docs/observability.md, "Workers and health probes"): 2 is
# argparse's for bad arguments; 3 keeps an outage, which ends by itself, apart from 1, a fleet
# (or a setting) that someone has to see to.
HEALTHY, UNHEALTHY, USAGE, DATABASE_UNREACHABLE = 0, 1, 2, 3
EXIT_STATUS = (
    f"exit status: {HEALTHY} healthy; {UNHEALTHY} unhealthy, each reason on a line of its own "
    "(or the database turned this command's connection away: authentication, a role or a "
    f"database that does not exist); {USAGE} bad arguments; {DATABASE_UNREACHABLE} database "
    "unreachable (connection refused, a host name that does not resolve, a connect timeout, a "
    "server starting up or full): the workers were not judged, one line on stderr says why")


def _max_stall(value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ConfigurationError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration (use e.g. 90s, 5m, 1h)") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than zero, got {value!r}")
    return seconds


def _queue(value: str) -> str:
    if not NAME_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a queue name: use 1-200 characters from [A-Za-z0-9_.:-]")
    return value


def _add_max_stall(parser: Any) -> None:
    parser.add_argument("--max-stall", type=_max_stall, default=DEFAULT_MAX_STALL,
                        metavar="DURATION",
                        help="a worker with no heartbeat, no round of its loop, or no claim "
                             "while its queues had due jobs for this long is stalled "
                             "(default 5m)")


def add_workers_arguments(parser: Any) -> None:
    _add_max_stall(parser)


def add_health_arguments(parser: Any) -> None:
    parser.add_argument("--queue", "-q", action="extend", nargs="+", dest="queues",
                        type=_queue, metavar="QUEUE",
                        help="the queue(s) that must have a worker that is not stalled; only "
                             "their workers are judged (default: XJOBS['QUEUES'] when given, "
                             "else every queue a worker serves, and every worker)")
    _add_max_stall(parser)


def workers(out: Any, options: dict[str, Any]) -> None:
    """``xjobs workers``: a table, or ``--json`` a list of the records."""
    records = get_engine().workers_list(max_stall=options["max_stall"])
    now = db_now()
    out.emit(records, lambda: out.table(
        ("id", "host", "pid", "queues", "version", "running", "finished", "heartbeat",
         "last claim", "status"),
        [(w.id, w.host, w.pid, ",".join(w.queues), w.version or "-",
          f"{w.running}/{w.concurrency}", w.finished, ago(w.seen_at, now),
          ago(w.claimed_at, now), f"STALLED: {w.stalled}" if w.stalled else "ok")
         for w in records],
        empty="(no worker seen in the last day)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What ``xjobs health`` says of the workers: healthy, or each reason it is not."""

    max_stall: float
    queues: tuple[str, ...]  # the queues asked
    workers: tuple[WorkerRecord, ...]  # the workers judged
    reasons: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return not self.reasons

    def lines(self) -> list[str]:
        if self.reasons:
            return list(self.reasons)
        queues = ", ".join(self.queues) or "none asked"
        return [f"healthy: {len(self.workers)} worker(s), none stalled (max stall "
                f"{span(self.max_stall)}); queues: {queues}"]

    def as_json(self) -> dict[str, Any]:
        return {"status": "healthy" if self.healthy else "unhealthy", "healthy": self.healthy,
                "database": conf.get().database, "max_stall_seconds": self.max_stall,
                "queues": list(self.queues), "reasons": list(self.reasons),
                "workers": json_columns.as_json(list(self.workers))}

    def exit(self) -> None:
        """End the command with status 1 when unhealthy (the reasons are printed already)."""
        if self.reasons:
            raise CommandError(f"unhealthy: {len(self.reasons)} problem(s)",
                               returncode=UNHEALTHY)


@dataclass(frozen=True, slots=True, kw_only=True)
class NoDatabase:
    """``xjobs health`` could not read the jobs' database: unreachable (an outage, exit 3),
    or ``refused`` (the server turned the connection away: exit 1)."""

    alias: str
    reason: str  # the driver's message, on one line
    refused: bool
    max_stall: float

    def line(self) -> str:
        what = "database refused the connection" if self.refused else "database unreachable"
        return f"{what} (alias {self.alias!r}): {self.reason}"

    def as_json(self) -> dict[str, Any]:
        return {"overall": BAD if self.refused else "unreachable", "probe": {
            "status": "unhealthy" if self.refused else "database_unreachable",
            "healthy": False, "database": self.alias, "reason": self.reason,
            "max_stall_seconds": self.max_stall, "reasons": [self.line()]}}

    def exit(self) -> None:
        raise CommandError(self.line(),
                           returncode=UNHEALTHY if self.refused else DATABASE_UNREACHABLE)


def no_database(exc: BaseException, max_stall: float) -> NoDatabase | None:
    """What ``exc`` says of the database when it is a connection error (None otherwise): the
    connect failed, or the connection broke under the command (the server went away)."""
    engine = get_engine()
    if not engine.is_connection_error(exc):
        return None
    refused = engine.connection_refused(exc)
    engine.reset_connection()
    # libpq's first line is the reason (the next ones are a hint, or, for a host with several
    # addresses, each attempt again).
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return NoDatabase(alias=engine.alias, reason=" ".join(lines[0].split()), refused=refused,
                      max_stall=max_stall)


def verdict(queues: Sequence[str] | None, max_stall: float) -> Verdict:
    """Judge the workers: each stalled one is a reason, and so is each asked queue without a
    worker that is not stalled. Asked: ``queues``, else XJOBS["QUEUES"] when the project gives
    it, else every queue a worker serves (a project that leaves QUEUES unset and has no worker
    at all asks none: pass --queue to require one)."""
    records = get_engine().workers_list(max_stall=max_stall)
    settings = conf.get()
    if queues:
        asked = tuple(dict.fromkeys(queues))
        judged = [w for w in records if set(w.queues) & set(asked)]
    else:
        asked = settings.queues if settings.queues_given else tuple(
            sorted({q for w in records for q in w.queues}))
        judged = list(records)
    reasons = [f"worker {w.id} ({w.host} pid {w.pid}) is stalled: {w.stalled}"
               for w in judged if w.stalled]
    for queue in asked:
        serving = [w for w in records if queue in w.queues]
        if not serving:
            reasons.append(f"queue {queue!r}: no worker serves it{_unknown(queue, records)}")
        elif all(w.stalled for w in serving):
            reasons.append(f"queue {queue!r}: every worker that serves it is stalled")
    return Verdict(max_stall=max_stall, queues=asked, workers=tuple(judged),
                   reasons=tuple(reasons))


def _unknown(queue: str, records: Sequence[WorkerRecord]) -> str:
    """For a queue no worker serves: what else names it, when nothing does (a name mistyped
    in --queue reads as a queue with no worker, and says which names exist)."""
    settings = conf.get()
    named = {*settings.queues, *registry.worked_queues(settings),
             *(job.queue for job in registry.all_jobs().values()),
             *(q for w in records for q in w.queues)}
    if queue in named:
        return ""
    return (", and neither XJOBS['QUEUES'], a registered job nor a worker seen in the last day "
            f"names it (they name: {', '.join(sorted(named))})")
