"""``manage.py xjobs_relay``: a dedicated outbox relay process (thin: the relay is in
worker/relay.py). SIGTERM/SIGINT stop it after the batch in hand; a second signal exits now
(the batch's transaction then rolls back and its rows stay pending for the next relay)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from ... import conf, outbox
from ...engines import get_engine
from ...exceptions import ConfigurationError, XJobsError
from ...values import parse_duration
from ...worker.options import new_worker_id
from ...worker.relay import Relay
from ...worker.shutdown import ShutdownSignals
from .. import cli


class Command(cli.XJobsCommand):
    help = "Relay the enqueue_on_commit outbox into the job queue until SIGTERM/SIGINT."
    requires_system_checks: list[str] = []  # as xjobs_worker: django-xjobs' own checks only

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", action="append", dest="databases", metavar="ALIAS",
                            help="outbox alias to relay (repeat for several); default "
                                 "XJOBS['OUTBOX']['DATABASES']")
        parser.add_argument("--batch-size", type=int,
                            help="rows per relay transaction; default "
                                 "XJOBS['OUTBOX']['BATCH_SIZE']")
        parser.add_argument("--poll-interval",
                            help="look without a wake-up this often; default "
                                 "XJOBS['OUTBOX']['POLL_INTERVAL']")
        parser.add_argument("--once", action="store_true",
                            help="relay what is pending now, print how many, and exit")
        parser.add_argument("--worker-id", help="name in application_name (default host:pid)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.check(tags=["django_xjobs"], display_num_errors=False)
        settings = conf.get()
        aliases = tuple(options["databases"] or settings.outbox.databases)
        unknown = [a for a in aliases if a not in settings.outbox.databases]
        if unknown:
            raise cli.usage_error(f"--database {unknown}: not in XJOBS['OUTBOX']['DATABASES'] "
                                  f"= {list(settings.outbox.databases)}")
        if options["batch_size"] is not None and options["batch_size"] < 1:
            raise cli.usage_error("--batch-size must be >= 1")
        poll = None
        if options["poll_interval"] is not None:
            try:
                poll = parse_duration(options["poll_interval"], what="--poll-interval")
            except ConfigurationError as exc:
                raise cli.usage_error(str(exc)) from None
            if poll <= 0:
                raise cli.usage_error("--poll-interval must be greater than zero")
        if options["once"]:
            try:
                moved = outbox.relay_pending(aliases)
            except (DatabaseError, XJobsError) as exc:
                raise CommandError(f"relay failed: {exc}") from None
            self.stdout.write(f"relayed {moved} staged job(s)")
            return
        cli.log_to_stderr(options["verbosity"])
        log = logging.getLogger("django_xjobs.worker")
        stop = threading.Event()
        worker_id = options["worker_id"] or new_worker_id()
        relay = Relay(engine=get_engine(), worker_id=worker_id, stop=stop, aliases=aliases,
                      batch_size=options["batch_size"], poll_interval=poll)
        signals = ShutdownSignals(lambda reason: stop.set())
        signals.install()
        log.info("relay %s started: outbox %s -> jobs %r, batch %d, poll %gs", worker_id,
                 ",".join(aliases), relay.engine.alias, relay.batch_size, relay.poll_interval)
        try:
            relay.run()
        finally:
            signals.uninstall()
            relay.close_connection()
        log.info("relay %s stopped: %d staged job(s) relayed", worker_id, relay.relayed)
