"""``manage.py xjobs_soak``: the chaos self-test, on this project's database and settings.

    manage.py xjobs_soak [--duration 60s] [--workers 4] [--seed N] [--queue xjobs_soak]

Starts its own worker processes on its own queue and jobs, enqueues a mixed workload while it
kills, stops and disconnects them, then checks the invariants over the tables, prints one line
per invariant, cleans up its rows and exits 0 when every invariant held, 1 when one did not
(with its seed, the offending ids and the timeline of faults). Thin: the work is in
``django_xjobs/soak/`` (docs/soak.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import CommandError

from ...exceptions import ConfigurationError
from ...values import NAME_RE, parse_duration
from .. import cli


def _seconds(what: str, low: float, high: float) -> Any:
    def parse(value: str) -> float:
        try:
            seconds = parse_duration(value, what=what)
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not low <= seconds <= high:
            raise argparse.ArgumentTypeError(
                f"{what} must be between {low:g}s and {high:g}s, got {value!r}")
        return seconds
    return parse


def _count(what: str, low: int, high: int) -> Any:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = low - 1
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(
                f"{what} must be an integer from {low} to {high}, got {value!r}")
        return number
    return parse


def _queue(value: str) -> str:
    if not NAME_RE.match(value):
        raise argparse.ArgumentTypeError(f"invalid queue name {value!r}")
    return value


class Command(cli.XJobsCommand):
    help = ("Chaos self-test: run a mixed workload through worker processes of this project "
            "while killing and disconnecting them, then check that no job was lost, none ran "
            "after it finished and no limit was exceeded (docs/soak.md).")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--duration", type=_seconds("--duration", 10, 24 * 3600),
                            default=60.0, help="how long jobs are produced and faults "
                                               "injected, e.g. 60s or 10m (default 60s); the "
                                               "drain and the checks come after")
        parser.add_argument("--workers", type=_count("--workers", 1, 32), default=4,
                            help="worker processes (default 4)")
        parser.add_argument("--concurrency", type=_count("--concurrency", 1, 64), default=2,
                            help="threads per worker process (default 2)")
        parser.add_argument("--seed", type=_count("--seed", 0, 2**63 - 1),
                            help="the random seed of the workload and the faults (default: random, "
                                 "printed); the same seed replays the same choices")
        parser.add_argument("--queue", type=_queue, default="xjobs_soak",
                            help="the soak's own queue (default xjobs_soak): it must have no "
                                 "live jobs, and no other worker may serve it")
        parser.add_argument("--lease", type=_seconds("--lease", 1, 60), default=2.0,
                            help="its workers' lease (default 2s): a stopped worker loses its "
                                 "jobs after this long")
        parser.add_argument("--rate", type=_count("--rate", 1, 10_000), default=30,
                            help="enqueues per second while producing (default 30)")
        parser.add_argument("--no-chaos", action="store_true",
                            help="no faults: the workload and the checks only")
        parser.add_argument("--hold-transaction", action="store_true",
                            help="hold a REPEATABLE READ transaction open for the whole run "
                                 "and check that the health panel names it")
        parser.add_argument("--drain-timeout", type=_seconds("--drain-timeout", 5, 3600),
                            default=120.0, help="how long to wait for every job to finish "
                                                "after the run (default 120s)")
        parser.add_argument("--keep", action="store_true",
                            help="leave the soak's rows in place (no clean-up)")
        parser.add_argument("--log-dir", type=Path,
                            help="where the workers' logs go (default: a new temp directory)")
        # How the soak starts its worker processes (docs/soak.md): with the soak's jobs
        # registered, the rest of the arguments go to xjobs_worker.
        parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)

    def run_from_argv(self, argv: list[str]) -> None:
        if argv[2:3] == ["--worker"]:
            from ...soak import jobs  # noqa: F401 - registers the soak's jobs

            call_command("xjobs_worker", *argv[3:])
            return
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        # The project's checks first, before the soak's own jobs are registered: their queue is
        # the soak's, in no XJOBS["QUEUES"], and is no finding about the project.
        self.check(tags=["django_xjobs"], display_num_errors=False)
        # Registers the soak's jobs, which only the soak and its workers may know; run.py
        # imports the console's readers, which a plain `manage.py help` need not load.
        from ...soak import jobs  # noqa: F401
        from ...soak.run import LiveQueue, Options, run  # (the same)
        opts = Options(
            duration=options["duration"], workers=options["workers"],
            concurrency=options["concurrency"], seed=options["seed"], queue=options["queue"],
            lease=options["lease"], per_second=float(options["rate"]),
            chaos=not options["no_chaos"], hold_transaction=options["hold_transaction"],
            drain_timeout=options["drain_timeout"], keep=options["keep"],
            log_dir=options["log_dir"],
        )
        if opts.log_dir is not None:
            opts.log_dir.mkdir(parents=True, exist_ok=True)
        say = self.stdout.write
        try:
            report = run(opts, lambda line: say(f"xjobs_soak: {line}"))
        except LiveQueue as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            raise CommandError("interrupted: its workers are stopped and what it enqueued is "
                               "cancelled and deleted") from None
        faults = ", ".join(f"{n} {kind}" for kind, n in sorted(report.faults.items()))
        say(f"xjobs_soak: {report.enqueued} enqueued in {report.seconds:.0f}s; faults: "
            f"{faults or 'none'}")
        for verdict in report.verdicts:
            for line in verdict.lines():
                say(line)
        for problem in report.problems:
            say(f"  FAIL  {problem}")
        for note in report.notes:
            say(f"  note  {note}")
        if report.held:
            say(f"xjobs_soak: every invariant held (seed {report.seed})")
            return
        say("xjobs_soak: timeline of faults:")
        for line in report.timeline:
            say(f"  {line}")
        raise CommandError(
            f"an invariant failed (seed {report.seed}; worker logs in {report.log_dir}); "
            f"replay with --seed {report.seed}")
