"""A worker's options (``WorkerOptions``: the XJOBS settings, overridden by the command's flags)
and its id (``new_worker_id``: the name its claims, its x_workers row and its connections carry).
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field

from .. import conf, registry
from .duties import Duty


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    queues: tuple[str, ...]
    concurrency: int
    prefetch: int | None  # None = adaptive
    lease: float
    heartbeat: float
    poll_interval: float
    shutdown_grace: float
    queue_concurrency: dict[str, int] = field(default_factory=dict)
    notify: bool = True
    burst: bool = False  # exit once nothing is due and nothing is in flight
    install_signals: bool = True
    worker_id: str | None = None
    # Background duties to run beside the job loop (worker/duties.py), in start order: handed
    # in by whoever composes the process (django_xjobs/worker_process.py); none by default.
    duties: tuple[type[Duty], ...] = ()
    # The process id of the supervisor that runs this worker (--processes, or the soak's pool):
    # a repeated SIGTERM/SIGINT is the same stop arriving twice, not a request to exit at once
    # (worker/shutdown.py); and the worker stops by itself once that process is gone (SIGKILLed,
    # say), rather than working on as an orphan nobody will stop. Given by the supervisor, not
    # read here: a supervisor that dies while this process starts up would otherwise be missed.
    supervisor: int | None = None
    # Touched while the loop goes round (--health-file; worker/liveness.py).
    health_file: str | None = None
    # Recycling (worker/recycling.py): stop claiming and leave, for a fresh process to take
    # over, after settling this many runs or once the resident memory passes this many MiB;
    # None: never. Not read from the settings here: XJOBS["MAX_JOBS_PER_PROCESS"] and
    # ["MAX_MEMORY"] are a worker process's policy, which xjobs_worker hands in, and an
    # in-process worker (testing.drain) does not follow.
    max_jobs_per_process: int | None = None
    max_memory: int | None = None

    @classmethod
    def from_settings(cls, **overrides: object) -> WorkerOptions:
        s = conf.get()
        values: dict[str, object] = {
            "queues": registry.worked_queues(s),
            "concurrency": s.concurrency,
            "prefetch": s.prefetch,
            "lease": s.lease,
            "heartbeat": s.heartbeat,
            "poll_interval": s.poll_interval,
            "shutdown_grace": s.shutdown_grace,
            "queue_concurrency": dict(s.queue_concurrency),
            "notify": s.notify,
        }
        given = {k: v for k, v in overrides.items() if v is not None}
        lease = given.get("lease")
        if isinstance(lease, (int, float)) and "heartbeat" not in given:
            # The lease alone: renew as often as that lease needs (as XJOBS["LEASE"] alone
            # does), never less often than the settings ask.
            given["heartbeat"] = min(s.heartbeat, conf.default_heartbeat(lease))
        values.update(given)
        if values["prefetch"] == "auto":
            values["prefetch"] = None
        return cls(**values)  # type: ignore[arg-type]


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
