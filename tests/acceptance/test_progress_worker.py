"""``ctx.progress`` in a real worker process: visible in the database while the job runs (about
one write a second), shown by ``manage.py xjobs show`` with its percentage and ETA, and the last
values kept once the job is done (docs/observability.md, "Progress")."""

from __future__ import annotations

import re
import time
from io import StringIO

import pytest
from django.core.management import call_command

from django_xjobs import api

from .conftest import SETTLE, wait_state

pytestmark = pytest.mark.acceptance


def test_progress_is_visible_while_the_job_runs_and_xjobs_show_gives_an_eta(start_worker):
    from tests.testapp import jobs

    worker = start_worker("progress")
    handle = jobs.reports_progress.enqueue(items=60, pause=0.1)  # about 6 s

    seen: list[float] = []
    shown = ""
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        record = api.get_job(handle.id)
        if record.state != "running":
            if record.state == "done":
                break
            time.sleep(0.05)  # the sampling interval
            continue
        if record.progress is not None and (not seen or record.progress.done != seen[-1]):
            seen.append(record.progress.done)
            if len(seen) >= 2 and not shown:
                out = StringIO()
                call_command("xjobs", "show", str(handle.id), stdout=out)
                shown = out.getvalue()
        time.sleep(0.05)  # the sampling interval

    assert len(seen) >= 2, f"progress seen while running: {seen}\n{worker.log()}"
    # The last report (60 of 60) can be seen before the run's acknowledgement lands.
    assert seen == sorted(seen) and all(0 < done <= 60 for done in seen)
    assert re.search(r"progress: \d+ of 60 \(\d+\.\d%\): item \d+ of 60, reported ", shown), shown
    eta = r"eta: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\S* \((in [0-9hms]+|due now)\)"
    assert re.search(eta, shown), shown

    row = wait_state(handle.id, "done")
    assert row.progress["done"] == 60 and row.progress["message"] == "item 60 of 60"
    (entry,) = api.get_job(handle.id).attempts
    assert (entry.outcome, entry.worker) == ("done", worker.id)
