"""A real worker under a held horizon (docs/performance.md, "Under a held horizon"): while
another session holds a snapshot far enough back, its claims start from floors, the jobs keep
flowing, a job the floors cannot see is claimed by a sweep, and once the snapshot is let go the
claims scan from the start again (at once here: its sweeps are cheap).

This is the mechanism at a CI size; ``make bench-horizon`` measures it (a 30-minute hold under
an offered load, beside the raw reference). Each wait is on the worker's log or a job's state.
"""

from __future__ import annotations

import re

from django_xjobs.worker.floors import HORIZON_XIDS, SWEEP
from tests.conftest import burn_transaction_ids, raw_connection

from .conftest import wait_exit, wait_log, wait_state

ON = "claims start from floors"
OFF = "claims scan from the start again"


def test_a_held_snapshot_turns_floors_on_and_the_jobs_keep_flowing(start_worker):
    from django.db import connection

    from tests.testapp.jobs import noop

    worker = start_worker("floors", settings={"WORKER_SEEN_INTERVAL": "0.2s"})
    holder = raw_connection()
    try:
        holder.execute("set transaction isolation level repeatable read")
        holder.execute("select count(*) from x_jobs")
        burn_transaction_ids(HORIZON_XIDS + 100)
        wait_log(worker, ON)

        first = [noop.enqueue(i=i) for i in range(50)]
        for handle in first:
            wait_state(handle.id, "done")

        # A job made due with a run_at an hour back: below every floor, found by a sweep.
        late = noop.using(delay=3600).enqueue(i="late")
        with connection.cursor() as cursor:
            cursor.execute("update x_jobs set run_at = now() - interval '1 hour'"
                           " where id = %s", [late.id])
        wait_state(late.id, "done", timeout=SWEEP + 30)
    finally:
        holder.rollback()
        holder.close()
    # Off at once where the last sweeps were cheap, as they are on this small table; a sweep
    # that took longer than RELEASE_WALK keeps its queue's floors until the next, SWEEP later
    # (tests/unit/test_floors.py).
    wait_log(worker, OFF, timeout=SWEEP + 30)
    last = noop.enqueue(i="after")
    wait_state(last.id, "done")
    worker.proc.terminate()
    wait_exit(worker)
    log = worker.log()
    assert "Traceback" not in log
    # Its claims did start from floors (the worker's counters, logged as it stops).
    floored = re.search(r"'floored': (\d+)", log)
    assert floored and int(floored.group(1)) > 0, log[-2000:]
