"""``manage.py xjobs_worker``: run a worker until SIGTERM/SIGINT (thin: the loop is in worker/)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from ... import conf, registry, worker_process
from ...exceptions import ConfigurationError
from ...values import NAME_RE, parse_duration, parse_mebibytes
from ...worker.loop import Worker
from ...worker.recycling import EXIT_RECYCLED, resident_bytes
from .. import cli


def _prefetch(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 0, got {value!r}")
    return number


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port number, 1 to 65535, got {value!r}")
    return number


def _job_count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of jobs >= 1, got {value!r}")
    return number


def _mebibytes(value: str) -> int:
    try:
        return parse_mebibytes(value, what="memory size")
    except ConfigurationError:
        raise argparse.ArgumentTypeError(
            f"must be a memory size of at least 1 MiB: a number of MiB (512), or 512MiB, 1GiB; "
            f"got {value!r}") from None


def _duration(value: str, option: str) -> float:
    try:
        return parse_duration(value, what=option)
    except ConfigurationError as exc:
        raise cli.usage_error(str(exc)) from None


class Command(cli.XJobsCommand):
    help = "Run a django-xjobs worker: claim due jobs, run them, acknowledge them."
    # Django's full system checks load every URLconf and admin class: a quarter of a second of
    # start-up for a process that serves no requests. The worker runs django-xjobs' own checks
    # (the XJOBS settings, the database alias) instead; `manage.py check` still runs them all.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--queue", "-q", action="extend", nargs="+", dest="queues",
                            metavar="QUEUE",
                            help="queue(s) to work: --queue a b, or --queue a --queue b; "
                                 "default: XJOBS['QUEUES'], else 'default' and every queue a "
                                 "registered job names")
        parser.add_argument("--concurrency", "-c", type=int,
                            help="executor threads; default XJOBS['CONCURRENCY']")
        parser.add_argument("--prefetch", type=_prefetch,
                            help="jobs claimed ahead of free threads; default XJOBS['PREFETCH']")
        parser.add_argument("--lease", help="lease length, e.g. 30s, at least 3 x the heartbeat "
                                            "interval; default XJOBS['LEASE']")
        parser.add_argument("--heartbeat",
                            help="renewal interval; default XJOBS['HEARTBEAT'], or with --lease "
                                 "alone the shorter of it and min(10s, lease / 3)")
        parser.add_argument("--poll-interval",
                            help="poll when idle; default XJOBS['POLL_INTERVAL']")
        parser.add_argument("--shutdown-grace",
                            help="time in-flight jobs get on SIGTERM; "
                                 "default XJOBS['SHUTDOWN_GRACE']")
        parser.add_argument("--burst", action="store_true",
                            help="exit once no job is due and none is in flight")
        parser.add_argument("--worker-id", help="name in claimed_by (default host:pid:random)")
        parser.add_argument("--shard", action="append", dest="shards", metavar="ALIAS",
                            help="with the jobs sharded by tenant (XJOBS['SHARDS']), work this "
                                 "shard (repeatable: each shard its own processes, connections, "
                                 "leases and duties); default every shard (docs/scaling.md)")
        parser.add_argument("--no-scheduler", action="store_true",
                            help="do not run the cron scheduler and maintenance here (run "
                                 "manage.py xjobs_scheduler, or leave it to other workers)")
        parser.add_argument("--no-relay", action="store_true",
                            help="do not relay the enqueue_on_commit outbox here (run "
                                 "manage.py xjobs_relay, or leave it to other workers)")
        parser.add_argument("--no-stats", action="store_true",
                            help="do not fold the counters' deltas here (leave it to other "
                                 "workers; docs/observability.md)")
        parser.add_argument("--metrics-port", type=_port, metavar="PORT",
                            help="serve Prometheus metrics over HTTP on PORT, every interface "
                                 "(needs django-xjobs[prometheus]; with --processes the "
                                 "supervisor serves them; docs/observability.md)")
        # Set by the supervisor on the processes it starts, with its own process id
        # (worker/shutdown.py; worker/watchdog.py).
        parser.add_argument("--supervised", type=int, metavar="PID", help=argparse.SUPPRESS)
        parser.add_argument("--processes", type=int, default=1,
                            help="run N worker processes under a supervisor that restarts any "
                                 "that dies (default 1: this process is the worker, or with "
                                 "recycling the supervisor of one)")
        parser.add_argument("--max-jobs-per-process", type=_job_count, metavar="N",
                            help="recycle a worker process after it settled N jobs: it stops "
                                 "claiming, finishes its runs and exits, and a fresh one takes "
                                 "its place (Celery's --max-tasks-per-child); default "
                                 "XJOBS['MAX_JOBS_PER_PROCESS'] (docs/deployment.md)")
        parser.add_argument("--max-memory", type=_mebibytes, metavar="MiB",
                            help="recycle a worker process once its resident memory, checked "
                                 "after each job, exceeds this many MiB (512, or 512MiB, 1GiB; "
                                 "Celery's --max-memory-per-child, which counts KiB); default "
                                 "XJOBS['MAX_MEMORY']")
        parser.add_argument("--health-file", metavar="PATH",
                            help="touch PATH (creating it) at most once a second while the "
                                 "worker's loop goes round: a probe that watches its age sees "
                                 "a wedged or stopped worker (docs/deployment.md)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.check(tags=["django_xjobs"], display_num_errors=False)
        queues = options["queues"]
        if queues:
            bad = [q for q in queues if not NAME_RE.match(q)]
            if bad:
                raise cli.usage_error(f"invalid queue name(s): {bad}")
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise cli.usage_error("--concurrency must be >= 1")
        health_file = options["health_file"]
        if health_file is not None:
            _check_health_file(health_file, options["processes"])
        settings = conf.get()
        max_jobs = options["max_jobs_per_process"] or settings.max_jobs_per_process
        max_memory = options["max_memory"] or settings.max_memory
        if max_memory is not None and resident_bytes() is None:
            raise CommandError("--max-memory (XJOBS['MAX_MEMORY']) reads the resident memory "
                               "from /proc/self/statm, which this system does not have")
        overrides: dict[str, Any] = {
            "queues": tuple(queues) if queues else None,
            "concurrency": options["concurrency"],
            "prefetch": options["prefetch"],
            "burst": options["burst"],
            "worker_id": options["worker_id"],
            "supervisor": options["supervised"],
            "health_file": health_file,
            "max_jobs_per_process": max_jobs,
            "max_memory": max_memory,
        }
        for key in ("lease", "heartbeat", "poll_interval", "shutdown_grace"):
            if options[key] is not None:
                overrides[key] = _duration(options[key], f"--{key.replace('_', '-')}")
        # The duties' classes are chosen once this process runs a worker itself: a supervisor
        # (--processes) runs none, and need not import the scheduler.
        duties = [name for name in worker_process.DUTIES if not options.get(f"no_{name}")]
        worker_options = worker_process.options(duties=(), **overrides)
        if worker_options.lease < 3 * worker_options.heartbeat:
            raise cli.usage_error(
                f"--lease ({worker_options.lease:g}s) must be at least 3 x the heartbeat "
                f"interval ({worker_options.heartbeat:g}s)"
            )
        if options["processes"] < 1:
            raise cli.usage_error("--processes must be >= 1")
        shards = _shards(options["shards"], settings)
        if len(shards) > 1 and health_file is not None:
            raise cli.usage_error("--health-file watches one worker loop: with several shards "
                                  "run one xjobs_worker --shard ALIAS per container")
        cli.log_to_stderr(options["verbosity"])
        if queues and options["supervised"] is None:  # said once, not by every child process
            _warn_unknown_queues(queues, settings)
        # A worker that recycles itself needs someone to start the next one: the supervisor,
        # which runs it even as the only process (docs/deployment.md, "Recycling worker
        # processes"). The processes it starts are supervised, and run the worker themselves.
        recycles = bool(max_jobs or max_memory) and options["supervised"] is None
        stop_serving = _serve_metrics(options["metrics_port"])
        try:
            if options["processes"] > 1 or recycles or len(shards) > 1:
                from ...worker.supervisor import Supervisor  # only then, after the checks

                # One set of processes per shard, each given its --shard (and a --worker-id
                # of its own: the id names the shard too).
                per_shard = [[*_child_args(options, shard=alias),
                              *(["--shard", alias] if alias else [])] for alias in shards]
                code = Supervisor([args for args in per_shard
                                   for _ in range(options["processes"])],
                                  _child_env(), burst=options["burst"]).run()
                if code:
                    raise CommandError("a worker process exited with an error")
                return
            conf.pin_database(shards[0])  # this process works one shard (None: unsharded)
            worker = Worker(dataclasses.replace(
                worker_options, duties=worker_process.duty_classes(duties)))
            try:
                worker.run()
            except ConfigurationError as exc:  # a database the worker cannot run on
                raise CommandError(str(exc)) from None
            if worker.error:
                raise CommandError(worker.error)
            if worker.recycled:  # drained: its supervisor starts a fresh process
                sys.exit(EXIT_RECYCLED)
        finally:
            stop_serving()


def _shards(given: list[str] | None, settings: conf.XJobsSettings) -> list[str | None]:
    """The shards this command works: those given (each checked), else every one; [None] when
    the jobs are not sharded (the one database; --shard may name it)."""
    if not given:
        return list(settings.shards) or [None]
    for alias in given:
        cli.checked_shard(alias)
    if len(set(given)) != len(given):
        raise cli.usage_error(f"--shard repeats an alias: {' '.join(given)}")
    return list(given) if settings.shards else [None]


def _serve_metrics(port: int | None) -> Callable[[], None]:
    """Serve the metrics on ``port`` from this process (None: not at all); how to stop. The
    figures are the database's, not a process's, so under --processes the supervisor alone
    serves them: the children are not given the port."""
    if port is None:
        return lambda: None
    from ... import metrics  # --metrics-port only: a plain worker's start-up skips it

    try:
        return metrics.serve(port)
    except ImproperlyConfigured as exc:  # prometheus_client is not installed
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"--metrics-port {port}: cannot listen there: "
                           f"{exc.strerror or exc}") from None


def _check_health_file(path: str, processes: int) -> None:
    """--health-file: one loop's file, in a directory that exists."""
    if processes > 1:
        raise cli.usage_error(
            "--health-file watches one worker loop: with --processes N a stalled process would "
            "hide behind the others (run one worker process per container, or probe with "
            "`manage.py xjobs health`)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise cli.usage_error(f"--health-file {path}: the directory {directory} does not exist")
    if os.path.isdir(path):
        raise cli.usage_error(f"--health-file {path} is a directory; give a file's path")
    if not os.access(directory, os.W_OK):
        raise cli.usage_error(f"--health-file {path}: the directory {directory} is not writable")


def _warn_unknown_queues(queues: list[str], settings: conf.XJobsSettings) -> None:
    """One line for the queues given with --queue that nothing in the settings or the registry
    names: likely a typo, but served all the same (XJOBS["QUEUES"] is what a worker works by
    default, not a closed list, and a job can be sent to any queue at enqueue time:
    docs/guide.md, "The worker")."""
    known = {*settings.queues, *registry.worked_queues(settings),
             *(job.queue for job in registry.all_jobs().values()),
             *(queue for _pattern, queue in settings.routes),
             *(entry["queue"] for entry in settings.schedule.values() if entry.get("queue"))}
    unknown = [q for q in dict.fromkeys(queues) if q not in known]
    if unknown:
        logging.getLogger("django_xjobs.worker").warning(
            "--queue %s: no registered job, XJOBS['QUEUES'], XJOBS['ROUTES'] or "
            "XJOBS['SCHEDULE'] entry names %s (they name: %s); serving %s anyway, for jobs "
            "enqueued there with .using(queue=...)",
            " ".join(unknown), "it" if len(unknown) == 1 else "them",
            ", ".join(sorted(known)), "it" if len(unknown) == 1 else "them")


def _child_args(options: dict[str, Any], *, shard: str | None = None) -> list[str]:
    """This command's options for one child process (everything but --processes and
    --metrics-port; with one process, its --worker-id and --health-file too: one such child
    lives at a time)."""
    args: list[str] = []
    for queue in options["queues"] or ():
        args += ["--queue", queue]
    if options["processes"] == 1:
        for key in ("worker_id", "health_file"):
            if options[key] is not None:
                value = options[key]
                if key == "worker_id" and shard is not None and len(options["shards"] or ()) != 1:
                    value = f"{value}@{shard}"
                args += [f"--{key.replace('_', '-')}", value]
    for key in ("concurrency", "prefetch", "lease", "heartbeat", "poll_interval",
                "shutdown_grace", "max_jobs_per_process", "max_memory"):
        if options[key] is not None:
            args += [f"--{key.replace('_', '-')}", str(options[key])]
    if options["burst"]:
        args.append("--burst")
    for name in worker_process.DUTIES:
        if options[f"no_{name}"]:
            args.append(f"--no-{name}")
    args += ["--verbosity", str(options["verbosity"])]
    return args


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
    # The children run `python -m django`: give them the import path this process has
    # (manage.py's directory is on it only because it is the script's directory).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env
