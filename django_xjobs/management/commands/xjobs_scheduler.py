"""``manage.py xjobs_scheduler``: run the cron scheduler (and maintenance, while it leads) as a
process of its own; SIGTERM/SIGINT stop it cleanly and hand the leadership back.

Thin: the scheduler is ``scheduler.runner.SchedulerDuty``, the same object every worker runs
beside its jobs (``xjobs_worker --no-scheduler`` leaves it to processes like this one).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ... import conf
from ...engines import get_engine
from ...scheduler.runner import SchedulerDuty
from ...worker.options import new_worker_id
from ...worker.shutdown import ShutdownSignals
from .. import cli

log = logging.getLogger("django_xjobs.scheduler")


class Command(cli.XJobsCommand):
    help = "Run the django-xjobs cron scheduler and maintenance (leader-elected) until stopped."
    requires_system_checks: list[str] = []  # django-xjobs' own checks only, as xjobs_worker

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--id", dest="scheduler_id",
                            help="name in x_scheduler_leader.holder (default host:pid:random)")
        parser.add_argument("--shard", metavar="ALIAS",
                            help="with the jobs sharded by tenant, the shard to lead (each "
                                 "shard elects its own leader; the schedule fires on the home "
                                 "shard, the others run their maintenance); default the home "
                                 "shard (docs/scaling.md)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.check(tags=["django_xjobs"], display_num_errors=False)
        cli.log_to_stderr(options["verbosity"])
        conf.pin_database(cli.checked_shard(options["shard"]))  # this process leads it
        stop = threading.Event()
        duty = SchedulerDuty(engine=get_engine(), worker_id=options["scheduler_id"]
                             or new_worker_id(), stop=stop)

        def on_signal(name: str) -> None:
            log.info("scheduler %s stopping (%s)", duty.worker_id, name)
            stop.set()

        signals = ShutdownSignals(on_signal)
        signals.install()
        settings = duty.settings
        log.info("scheduler %s started: leader=%s lease=%gs renew=%gs", duty.worker_id,
                 settings.leader, settings.leader_lease, settings.leader_renew)
        try:
            duty.run()
        finally:
            signals.uninstall()
            duty.close_connection()
        log.info("scheduler %s stopped", duty.worker_id)
