"""x_workers as ``xjobs workers`` and ``xjobs health`` read it: what ``worker_seen`` records,
and each rule of ``workers_list``'s ``stalled`` (docs/observability.md, "Workers and health
probes"), with rows written directly; then how the verdict of ``xjobs health`` and the panel
it prints agree, and the commands' refusals of bad input. Every test runs in one transaction,
so ``now()`` is one moment and the ages below are exact."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_xjobs.engines import get_engine
from django_xjobs.models import FlowPause, Job, WorkerRow
from django_xjobs.records import WorkerRecord
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db

STALL = 300.0  # seconds: `--max-stall 5m`
S = timedelta(seconds=1)
M = timedelta(minutes=1)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("select now()")
        return cursor.fetchone()[0]


def new_queue() -> str:
    return f"wk-{uuid.uuid4().hex[:8]}"


def worker(queue: str, **columns) -> str:
    """A worker row serving ``queue``, fine unless ``columns`` say otherwise: seen, looped and
    claimed just now, one run of four."""
    now = db_now()
    values = {"id": f"w-{uuid.uuid4().hex[:6]}", "host": "h", "pid": 1, "queues": [queue],
              "seen_at": now, "started_at": now - 2 * STALL * S, "loop_at": now,
              "claimed_at": now, "concurrency": 4, "running": 1, **columns}
    WorkerRow.objects.create(**values)
    return values["id"]


def due_job(queue: str, since: timedelta, **columns) -> str:
    """A job of ``queue`` due for ``since``."""
    handle = testapp_jobs.record.using(queue=queue).enqueue(tag="due")
    Job.objects.filter(id=handle.id).update(run_at=db_now() - since, **columns)
    return str(handle.id)


def listed(worker_id: str, max_stall: float = STALL) -> WorkerRecord:
    (record,) = [w for w in get_engine().workers_list(max_stall=max_stall) if w.id == worker_id]
    return record


def stalled(worker_id: str, max_stall: float = STALL) -> str | None:
    return listed(worker_id, max_stall).stalled


# ----------------------------------------------------------------------- worker_seen --


def test_worker_seen_records_the_report_with_its_ages_on_the_database_clock():
    queue = new_queue()
    get_engine().worker_seen("w-seen", "host-a", 42, [queue, "other"], version="1.2.3",
                             concurrency=8, running=3, finished=17, claimed_age=30.0,
                             loop_age=0.25)
    now = db_now()
    record = listed("w-seen")
    assert (record.host, record.pid, record.queues, record.version) == (
        "host-a", 42, (queue, "other"), "1.2.3")
    assert (record.concurrency, record.running, record.finished) == (8, 3, 17)
    assert (record.started_at, record.seen_at) == (now, now)
    assert record.claimed_at == now - 30 * S
    assert record.loop_at == now - timedelta(milliseconds=250)
    assert record.stalled is None

    # The next report replaces every figure; a worker that never claimed has no claimed_at.
    get_engine().worker_seen("w-seen", "host-a", 42, [queue], version="1.2.4", concurrency=8,
                             running=0, finished=20, claimed_age=None, loop_age=0.0)
    record = listed("w-seen")
    assert (record.queues, record.version, record.running, record.finished) == (
        (queue,), "1.2.4", 0, 20)
    assert (record.claimed_at, record.loop_at) == (None, now)


def test_rows_of_workers_gone_for_a_day_are_not_listed():
    queue = new_queue()
    old = worker(queue, seen_at=db_now() - timedelta(days=1, seconds=1))
    recent = worker(queue, seen_at=db_now() - timedelta(hours=23))
    ids = {w.id for w in get_engine().workers_list(max_stall=STALL)}
    assert recent in ids and old not in ids


# --------------------------------------------------------------------------- stalled --


def test_a_worker_without_a_heartbeat_for_max_stall_is_stalled():
    queue = new_queue()
    fresh = worker(queue, seen_at=db_now() - 299 * S)
    silent = worker(queue, seen_at=db_now() - 42 * M, loop_at=db_now() - 42 * M)
    assert stalled(fresh) is None
    assert stalled(silent) == "no heartbeat for 42m"
    assert stalled(silent, max_stall=3600) is None


def test_a_loop_that_has_not_gone_round_is_stalled_while_the_heartbeat_runs():
    queue = new_queue()
    now = db_now()
    wedged = worker(queue, loop_at=now - 40 * S)
    assert stalled(wedged, max_stall=30) == "loop has not gone round for 40s"
    assert stalled(wedged, max_stall=60) is None
    # The loop's age is judged at the heartbeat that reported it: a row written 20 s ago with
    # a loop that had gone round 5 s before that is not a wedged loop (its heartbeat is late,
    # which the heartbeat rule judges).
    late = worker(queue, seen_at=now - 20 * S, loop_at=now - 25 * S)
    assert stalled(late, max_stall=10) == "no heartbeat for 20s"
    assert stalled(late, max_stall=21) is None


def test_no_claim_while_a_queue_had_a_due_job_and_the_worker_had_room_is_stalled():
    queue = new_queue()
    now = db_now()
    idle = worker(queue, running=0, claimed_at=now - 10 * M)
    assert stalled(idle) is None  # nothing due
    job = due_job(queue, 6 * M)
    since = Job.objects.get(id=job).run_at.isoformat(sep=" ", timespec="seconds")
    assert stalled(idle) == (f"has not claimed for 10m although queue {queue!r} has had a job "
                             f"due since {since}")
    # Due for less than max_stall: the worker may just not have got to it.
    assert stalled(idle, max_stall=7 * 60) is None


@pytest.mark.parametrize("columns", [
    {"running": 4},  # no room: every run of its concurrency is running
    {"claimed_at": "recent"},  # it claimed (any job of any queue) lately
    {"queues": ["elsewhere"]},  # the due job is not of its queues
])
def test_the_claim_rule_needs_room_no_recent_claim_and_a_due_job_of_its_queues(columns):
    queue = new_queue()
    now = db_now()
    if columns.get("claimed_at") == "recent":
        columns["claimed_at"] = now - 299 * S
    wid = worker(queue, **{"running": 0, "claimed_at": now - 10 * M, **columns})
    due_job(queue, 6 * M)
    assert stalled(wid) is None


def test_a_worker_that_never_claimed_is_judged_from_its_start():
    queue = new_queue()
    now = db_now()
    young = worker(queue, running=0, claimed_at=None, started_at=now - 4 * M)
    old = worker(queue, running=0, claimed_at=None, started_at=now - 8 * M)
    due_job(queue, 6 * M)
    assert stalled(young) is None
    assert stalled(old).startswith("has not claimed for 8m although queue")


def test_only_jobs_the_claim_would_take_are_due():
    queue = new_queue()
    wid = worker(queue, running=0, claimed_at=db_now() - 10 * M)
    due_job(queue, 6 * M, state="blocked", blocked_on="acct:1")  # held by flow control
    due_job(queue, -M, state="delayed")  # not due yet
    assert stalled(wid) is None
    due_job(queue, 6 * M, state="delayed")  # delayed, its time passed: the claim takes it
    assert stalled(wid) is not None


def test_a_paused_queue_has_no_due_job():
    queue = new_queue()
    wid = worker(queue, running=0, claimed_at=db_now() - 10 * M)
    due_job(queue, 6 * M)
    pause = FlowPause.objects.create(kind="queue", key=queue)
    assert stalled(wid) is None
    FlowPause.objects.filter(pk=pause.pk).update(until=db_now() - S)  # the pause ended
    assert stalled(wid) is not None


def test_the_oldest_due_job_is_found_at_any_priority():
    queue = new_queue()
    wid = worker(queue, running=0, claimed_at=db_now() - 10 * M)
    due_job(queue, M, priority=9)
    oldest = due_job(queue, 7 * M, priority=-3)
    due_job(queue, 6 * M, priority=0)
    since = Job.objects.get(id=oldest).run_at.isoformat(sep=" ", timespec="seconds")
    assert stalled(wid).endswith(f"has had a job due since {since}")


def test_the_first_rule_that_holds_is_the_reason():
    queue = new_queue()
    now = db_now()
    due_job(queue, 30 * M)
    everything = worker(queue, seen_at=now - 6 * M, loop_at=now - 20 * M, running=0,
                        claimed_at=now - 20 * M)
    assert stalled(everything) == "no heartbeat for 6m"
    loop_and_claim = worker(queue, loop_at=now - 20 * M, running=0, claimed_at=now - 20 * M)
    assert stalled(loop_and_claim) == "loop has not gone round for 20m"


# ------------------------------------------------------------ the verdict and the panel --


def health(*args: str) -> tuple[int, str]:
    """``xjobs health`` in this process: (its exit status, its output)."""
    out = StringIO()
    try:
        call_command("xjobs", "health", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_a_queue_nothing_names_is_unhealthy_names_the_known_ones_and_overall_is_bad():
    """No worker, job, setting or registered job knows the queue (a name mistyped in a probe):
    unhealthy like any queue no worker serves, with the names that do exist; the panel's
    overall verdict is bad too, whatever the tables and VACUUM say."""
    served = new_queue()
    worker(served)
    code, out = health("--queue", "nosuchqueue")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(
        "queue 'nosuchqueue': no worker serves it, and neither XJOBS['QUEUES'], a registered "
        "job nor a worker seen in the last day names it (they name: "), lines[0]
    named = lines[0].split("(they name: ", 1)[1].rstrip(")").split(", ")
    assert {"default", served, testapp_jobs.record.queue} <= set(named)
    assert "nosuchqueue" not in named
    assert "overall: bad" in lines and "overall: ok" not in out

    code, out = health("--queue", "nosuchqueue", "--json")
    data = json.loads(out)
    assert code == 1 and data["overall"] == "bad"
    assert (data["probe"]["status"], data["probe"]["healthy"]) == ("unhealthy", False)
    assert len(data["probe"]["reasons"]) == 1


def test_a_queue_with_a_worker_reads_as_known_and_overall_follows_the_panel_when_healthy():
    queue = new_queue()
    worker(queue)
    code, out = health("--queue", queue, "--json")
    data = json.loads(out)
    assert code == 0 and data["probe"]["status"] == "healthy" and data["probe"]["reasons"] == []
    # Healthy: the panel's own verdict (tables, VACUUM, lapsed leases) is the overall one.
    assert data["overall"] == data["verdict"]


def test_the_panel_judges_the_workers_with_the_max_stall_of_the_verdict():
    queue = new_queue()
    late = worker(queue, seen_at=db_now() - 6 * M)

    def judged(max_stall: str) -> tuple[int, dict, str | None]:
        code, out = health("--queue", queue, "--max-stall", max_stall, "--json")
        data = json.loads(out)
        (row,) = [w for w in data["workers"] if w["id"] == late]
        return code, data, row["stalled"]

    code, data, stalled_as = judged("30m")
    assert (code, data["probe"]["healthy"], stalled_as) == (0, True, None)
    assert data["overall"] == data["verdict"]
    code, data, stalled_as = judged("5m")
    assert (code, data["probe"]["healthy"], stalled_as) == (1, False, "no heartbeat for 6m")
    assert data["overall"] == data["verdict"] == "bad"


# ------------------------------------------------------------------------- bad input --


@pytest.mark.parametrize(("args", "error"), [
    (["health", "--max-stall", "abc"], "'abc' is not a duration"),
    (["health", "--max-stall", "0s"], "must be greater than zero"),
    (["workers", "--max-stall", "-5m"], "argument --max-stall"),
    (["health", "--queue", "no spaces"], "'no spaces' is not a queue name"),
])
def test_bad_input_is_refused_before_any_read(args, error):
    with pytest.raises(CommandError, match=error):
        call_command("xjobs", *args, stdout=StringIO())


def test_the_health_file_needs_an_existing_directory_and_one_worker_process(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        call_command("xjobs_worker", "--health-file", str(tmp_path / "missing" / "alive"))
    with pytest.raises(CommandError, match="is a directory"):
        call_command("xjobs_worker", "--health-file", str(tmp_path))
    with pytest.raises(CommandError, match="watches one worker loop"):
        call_command("xjobs_worker", "--processes", "2", "--health-file",
                     str(tmp_path / "alive"))
    assert not (tmp_path / "alive").exists()
