"""``manage.py xjobs`` (stats and operator actions), ``xjobs_worker`` and ``xjobs_sql``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from typing import Any
from uuid import uuid4

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_xjobs import api
from django_xjobs.engines import get_engine
from django_xjobs.engines.postgres import statements as S
from django_xjobs.management.commands.xjobs_sql import as_prepare
from django_xjobs.models import Job, JobStep
from django_xjobs.records import Completion, Failure, Suspension
from tests.conftest import ROOT
from tests.testapp import jobs as testapp_jobs

record = testapp_jobs.record
COLUMNS = ["queue", "ready", "delayed", "running", "suspended", "blocked", "dead", "done",
           "cancelled"]


def run(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


def run_json(*args: str):
    return json.loads(run(*args))


def job_in_state(state: str, *, queue: str | None = None, **options):
    """A job of ``record`` driven to ``state`` through the engine's own operations."""
    engine = get_engine()
    queue = queue or f"q-{uuid4().hex[:10]}"
    if state == "delayed":
        return record.using(queue=queue, delay=timedelta(hours=1), **options).enqueue(tag=state)
    handle = record.using(queue=queue, **options).enqueue(tag=state)
    if state == "ready":
        return handle
    if state == "cancelled":
        api.cancel(handle.id)
        return handle
    (claimed,) = engine.jobs_claim(wants={queue: 1}, worker_id="tests:commands", lease_ms=60_000)
    assert claimed.id == str(handle.id), "another due job in this queue was claimed"
    if state == "done":
        engine.jobs_complete_if_owned([Completion(
            claim=claimed.claim, result_json='{"ok": true}')])
    elif state == "dead":
        engine.job_fail_if_owned(Failure(claim=claimed.claim,
                                         error="boom", retry_delay_ms=0, permanent=True))
    elif state == "suspended":
        engine.job_suspend_if_owned(Suspension(
            claim=claimed.claim,
            wake_at=timezone.now() + timedelta(hours=1)))
    else:
        assert state == "running", state
    assert handle.get().state == state
    return handle


def table(out: str) -> dict[str, dict[str, int]]:
    lines = out.splitlines()
    assert lines[0].split() == COLUMNS
    assert set(lines[1].replace(" ", "")) == {"-"}
    rows = {}
    for line in lines[2:]:
        if not line.strip() or line.startswith("outbox"):
            break
        cells = line.split()
        rows[cells[0]] = dict(zip(COLUMNS[1:], map(int, cells[1:]), strict=True))
    return rows


# ---------------------------------------------------------------------------------- stats --


@pytest.fixture
def one_of_each():
    """A queue holding one job in every state, plus a second ready one."""
    for state in ["done", "dead", "cancelled", "running", "suspended", "delayed", "ready"]:
        job_in_state(state, queue="stats-q")
    record.using(queue="stats-q").enqueue(tag="ready 2")
    record.using(queue="other-q").enqueue(tag="elsewhere")


EXPECTED = {"ready": 2, "delayed": 1, "running": 1, "suspended": 1, "blocked": 0, "dead": 1,
            "done": 1, "cancelled": 1}


@pytest.mark.django_db
def test_stats_table_shows_the_buckets_per_queue(one_of_each):
    out = run()
    rows = table(out)
    assert rows["stats-q"] == EXPECTED
    assert rows["other-q"] == {**dict.fromkeys(EXPECTED, 0), "ready": 1}
    assert list(rows) == sorted(rows)
    assert "outbox: 0 pending" in out


@pytest.mark.django_db
def test_stats_json_shows_the_buckets_per_queue(one_of_each):
    data = run_json("--json")
    queues = {q.pop("queue"): q for q in data["queues"]}
    assert queues["stats-q"] == EXPECTED
    assert queues["other-q"] == {**dict.fromkeys(EXPECTED, 0), "ready": 1}
    assert data["outbox"] == {
        "pending": 0, "oldest_pending_seconds": None,
        "databases": {"default": {"pending": 0, "oldest_pending_seconds": None}},
    }


@pytest.mark.django_db
def test_stats_of_an_empty_queue_table():
    out = run()
    assert "(no jobs)" in out
    assert run_json("--json")["queues"] == []


@pytest.mark.django_db
def test_a_ready_job_not_yet_due_counts_as_delayed():
    handle = record.using(queue="future-q").enqueue()
    Job.objects.filter(id=handle.id).update(run_at=timezone.now() + timedelta(hours=1))
    (row,) = run_json("--json")["queues"]
    assert (row["ready"], row["delayed"]) == (0, 1)


# ----------------------------------------------------------------------------------- show --


@pytest.mark.django_db
def test_show_prints_the_job():
    handle = record.using(tenant_id="acme").enqueue(tag="shown")
    out = run("show", str(handle.id))
    fields = dict(re.findall(r"^ *(\w+): (.*)$", out, re.M))
    assert fields["id"] == str(handle.id)
    assert fields["name"] == "testapp.record"
    assert fields["state"] == "ready"
    assert fields["tenant_id"] == "acme"
    assert fields["run_id"] == str(handle.run_id)
    assert '"tag": "shown"' in out


@pytest.mark.django_db
def test_show_prints_the_error_and_the_result():
    dead = job_in_state("dead")
    assert "boom" in run("show", str(dead.id)).split("last_error:", 1)[1]
    done = job_in_state("done")
    assert '"ok": true' in run("show", str(done.id))


@pytest.mark.django_db
def test_show_json():
    handle = record.using(idempotency_key="show:1").enqueue(tag="shown")
    data = run_json("show", str(handle.id), "--json")
    assert data["id"] == str(handle.id)
    assert data["run_id"] == str(handle.run_id)
    assert (data["name"], data["state"], data["queue"]) == ("testapp.record", "ready", "default")
    assert data["input"] == {"tag": "shown"}
    assert data["idempotency_key"] == "show:1"
    assert data["attempt"] == 0
    assert data["created_at"].startswith(str(timezone.now().year))


@pytest.mark.django_db
def test_json_given_before_the_action_also_gives_json():
    # `manage.py xjobs --json show ID` is accepted by the parser; a script using it must get
    # JSON, not the human table (the subcommand's own --json default overrides the top one).
    handle = record.enqueue(tag="shown")
    data = run_json("--json", "show", str(handle.id))
    assert data["id"] == str(handle.id)


@pytest.mark.django_db
@pytest.mark.parametrize(("job_id", "says"), [
    ("5eea474d-7aab-4b52-8838-15c1028bc0d9", "no job with id 5eea474d-"),
    ("not-a-uuid", "'not-a-uuid' is not a job id (a UUID)"),
])
@pytest.mark.parametrize("action", ["show", "cancel", "retry", "run-now", "why"])
def test_an_unknown_or_malformed_id_is_bad_usage(action, job_id, says):
    for args in ((action, job_id), (action, job_id, "--json")):
        with pytest.raises(CommandError, match=re.escape(says)) as info:
            run(*args)
        assert info.value.returncode == 2


# --------------------------------------------------------------------------------- cancel --


@pytest.mark.django_db
def test_cancel_with_a_reason():
    handle = record.enqueue(tag="doomed")
    out = run("cancel", str(handle.id), "--reason", "duplicate order")
    assert f"cancel: job {handle.id} (testapp.record) is now cancelled" in out
    row = handle.get()
    assert row.state == "cancelled"
    # with who cancelled it, as the console records it (docs/observability.md, "Logs")
    assert re.fullmatch(r"cancelled: duplicate order \(cli(:.+)?\)", row.last_error)
    assert row.finished_at is not None


@pytest.mark.django_db
def test_cancel_json_of_a_running_job_clears_its_lease_token():
    handle = job_in_state("running")
    assert handle.get().lease_token is not None
    data = run_json("cancel", str(handle.id), "--json")
    assert data["action"] == "cancel"
    assert data["changed"] is True
    assert data["job"]["id"] == str(handle.id)
    assert data["job"]["state"] == "cancelled"
    assert data["job"]["lease_token"] is None  # the run's late writes will read as lost
    assert re.fullmatch(r"cancelled: by cli(:.+)?", data["job"]["last_error"])


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["done", "cancelled"])
def test_cancel_of_a_finished_job_changes_nothing(state):
    handle = job_in_state(state)
    before = handle.get()
    data = run_json("cancel", str(handle.id), "--json", "--reason", "too late")
    assert data["changed"] is False
    assert data["reason"] == f"already {state}"
    assert data["job"]["state"] == state
    assert "unchanged" in run("cancel", str(handle.id))
    assert handle.get().last_error == before.last_error


@pytest.mark.django_db
def test_cancel_of_an_unknown_id_is_a_command_error():
    with pytest.raises(CommandError, match="no job with id"):
        run("cancel", str(uuid4()))


# ---------------------------------------------------------------------------------- retry --


@pytest.mark.django_db
def test_retry_of_a_dead_job_makes_it_ready_with_fresh_attempts():
    handle = job_in_state("dead")
    out = run("retry", str(handle.id))
    assert f"retry: job {handle.id} (testapp.record) is now ready" in out
    row = handle.get()
    assert (row.state, row.attempt, row.run_id) == ("ready", 0, handle.run_id)
    assert row.finished_at is None
    assert row.last_error == "boom"  # kept as the record of why it stopped


@pytest.mark.django_db
def test_retry_json_of_a_cancelled_job():
    handle = job_in_state("cancelled")
    data = run_json("retry", str(handle.id), "--json")
    assert (data["action"], data["changed"]) == ("retry", True)
    assert data["job"]["state"] == "ready"
    assert data["job"]["run_id"] == str(handle.run_id)


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["ready", "running", "done"])
def test_retry_of_a_job_that_is_not_dead_or_cancelled_changes_nothing(state):
    handle = job_in_state(state)
    data = run_json("retry", str(handle.id), "--json")
    assert data["changed"] is False
    assert state in data["reason"]
    assert handle.get().state == state


@pytest.mark.django_db
def test_retry_refuses_when_a_live_job_holds_the_key_and_names_it():
    dead = job_in_state("dead", idempotency_key="order:7")
    live = record.using(idempotency_key="order:7").enqueue(tag="the new one")
    assert live.created and live.id != dead.id
    with pytest.raises(CommandError) as info:
        run("retry", str(dead.id))
    assert info.value.returncode == 1  # the operation's refusal, not bad usage
    assert str(live.id) in str(info.value)
    assert f"xjobs show {live.id}" in str(info.value)
    with pytest.raises(CommandError, match=str(live.id)):
        run("retry", str(dead.id), "--json")
    # Nothing changed, and the connection is still usable after the refused update.
    assert dead.get().state == "dead"
    assert live.get().state == "ready"


@pytest.mark.django_db
def test_retry_of_an_unknown_id_is_a_command_error():
    with pytest.raises(CommandError, match="no job with id"):
        run("retry", str(uuid4()))


# -------------------------------------------------------------------------------- run-now --


@pytest.mark.django_db
def test_run_now_makes_a_delayed_job_due():
    handle = job_in_state("delayed")
    out = run("run-now", str(handle.id))
    assert f"run-now: job {handle.id} (testapp.record) is now ready" in out
    row = handle.get()
    assert row.state == "ready"
    assert row.run_at <= get_engine().db_now()


@pytest.mark.django_db
def test_run_now_json_of_a_suspended_job_keeps_it_suspended_but_due():
    handle = job_in_state("suspended")
    data = run_json("run-now", str(handle.id), "--json")
    assert (data["action"], data["changed"]) == ("run-now", True)
    assert data["job"]["state"] == "suspended"
    assert handle.get().run_at <= get_engine().db_now()


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["ready", "running", "dead"])
def test_run_now_of_a_job_with_nothing_to_bring_forward_changes_nothing(state):
    handle = job_in_state(state)
    data = run_json("run-now", str(handle.id), "--json")
    assert data["changed"] is False
    assert data["job"]["state"] == state


@pytest.mark.django_db
def test_run_now_of_an_unknown_id_is_a_command_error():
    with pytest.raises(CommandError, match="no job with id"):
        run("run-now", str(uuid4()))


# ---------------------------------------------------------------------------------- purge --


@pytest.fixture
def aged():
    """Finished jobs from 8 days ago, a recent one, and live ones created long ago."""
    old = {state: job_in_state(state) for state in ["done", "dead", "cancelled"]}
    long_ago = timezone.now() - timedelta(days=8)
    Job.objects.filter(id__in=[h.id for h in old.values()]).update(finished_at=long_ago,
                                                                 created_at=long_ago)
    recent = job_in_state("done")
    live = [job_in_state("ready"), job_in_state("delayed"), job_in_state("running")]
    Job.objects.filter(id__in=[h.id for h in live]).update(created_at=long_ago)
    JobStep.objects.create(run_id=old["done"].run_id, name="step-1", status="completed")
    JobStep.objects.create(run_id=recent.run_id, name="step-1", status="completed")
    return old, recent, live


@pytest.mark.django_db
def test_purge_deletes_only_finished_jobs_older_than_the_cutoff(aged):
    _, recent, live = aged
    out = run("purge", "--older-than", "7d")
    assert "purged 3 finished job(s)" in out
    remaining = set(Job.objects.values_list("id", flat=True))
    assert remaining == {recent.id, *(h.id for h in live)}
    # The steps of a purged run go with it; others stay.
    assert list(JobStep.objects.values_list("run_id", flat=True)) == [recent.run_id]


@pytest.mark.django_db
def test_purge_json_and_a_single_state(aged):
    old, _, _ = aged
    data = run_json("purge", "--older-than", "7d", "--state", "dead", "--json")
    assert data == {"deleted": 1, "states": ["dead"], "older_than_seconds": 7 * 86400}
    assert not Job.objects.filter(id=old["dead"].id).exists()
    assert Job.objects.filter(id=old["done"].id).exists()
    data = run_json("purge", "--older-than", "7d", "--json")
    assert data["deleted"] == 2
    assert run_json("purge", "--older-than", "7d", "--json")["deleted"] == 0


@pytest.mark.django_db
def test_purge_with_a_longer_age_keeps_everything(aged):
    assert run_json("purge", "--older-than", "9d", "--json")["deleted"] == 0
    assert Job.objects.count() == 7


@pytest.mark.django_db
def test_purge_cuts_off_on_the_database_clock_not_the_wall_clock():
    """On a machine an hour ahead, "older than 30 minutes" took the job finished just now."""
    from django_xjobs import api, clock

    recent = job_in_state("done")
    with clock.override(now=lambda: timezone.now() + timedelta(hours=1)):
        assert api.purge(older_than=timedelta(minutes=30)) == 0
    assert Job.objects.filter(id=recent.id).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("age", ["soon", "-1d", "7 days"])
def test_purge_with_a_bad_age_is_a_command_error(age):
    with pytest.raises(CommandError, match="older-than"):
        run("purge", "--older-than", age)


# --------------------------------------------------------------------------- xjobs_worker --


@pytest.mark.django_db(transaction=True)
def test_xjobs_worker_burst_drains_the_queue_and_returns():
    handles = [record.enqueue(tag=str(i)) for i in range(5)]
    handles.append(testapp_jobs.async_record.enqueue(tag="aio"))
    other = testapp_jobs.on_other_queue.enqueue()
    with override_settings(XJOBS={**settings.XJOBS, "QUEUES": ["default"]}):
        call_command("xjobs_worker", "--burst", "--concurrency", "2", "--worker-id",
                     "tests:burst", stdout=StringIO(), stderr=StringIO())
    rows = [h.get() for h in handles]
    assert [r.state for r in rows] == ["done"] * 6
    assert {r.claimed_by for r in rows} == {"tests:burst"}
    assert other.get().state == "ready"  # "other" is not in XJOBS["QUEUES"]


@pytest.mark.django_db(transaction=True)
def test_without_a_queues_setting_a_worker_works_every_queue_a_job_names():
    """@job(queue="other") runs on a plain `manage.py xjobs_worker` (the README quickstart)."""
    assert "QUEUES" not in settings.XJOBS
    default = record.enqueue(tag="default")
    other = testapp_jobs.on_other_queue.enqueue()
    call_command("xjobs_worker", "--burst", stdout=StringIO(), stderr=StringIO())
    assert (default.get().state, other.get().state) == ("done", "done")


@pytest.mark.django_db(transaction=True)
def test_xjobs_worker_burst_on_a_named_queue_works_only_that_queue():
    default = record.enqueue(tag="default")
    other = testapp_jobs.on_other_queue.enqueue()
    call_command("xjobs_worker", "--burst", "--queue", "other", stdout=StringIO(),
                 stderr=StringIO())
    assert (other.get().state, other.get().result) == ("done", "other")
    assert default.get().state == "ready"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("lease", "heartbeat"), [("2s", "0.666667s"), ("60s", "5s")])
def test_xjobs_worker_lease_alone_derives_a_heartbeat_that_fits_it(lease, heartbeat, caplog):
    """--lease without --heartbeat renews as XJOBS["LEASE"] alone would (min(10s, lease / 3)),
    never less often than the settings' HEARTBEAT (5s in the test settings)."""
    job = record.enqueue(tag="lease alone")
    with caplog.at_level("INFO", logger="django_xjobs.worker"):
        call_command("xjobs_worker", "--burst", "--lease", lease, stdout=StringIO(),
                     stderr=StringIO())
    assert job.get().state == "done"
    assert f"lease={lease} heartbeat={heartbeat} " in caplog.text


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--prefetch", "-1"], "--prefetch"),
        (["--queue", "bad queue"], "bad queue"),
        (["--queue", "default", "--queue", "a/b"], "a/b"),
        (["--lease", "1s", "--heartbeat", "1s"], "--lease"),
        (["--lease", "soon"], "soon"),
        (["--heartbeat=-1s"], "-1s"),
        (["--max-jobs-per-process", "0"], "--max-jobs-per-process"),
        (["--max-jobs-per-process", "-3"], "--max-jobs-per-process"),
        (["--max-jobs-per-process", "many"], "'many'"),
        (["--max-memory", "0"], "--max-memory"),
        (["--max-memory", "-512"], "--max-memory"),
        (["--max-memory", "512MB"], "'512MB'"),
        (["--max-memory", "lots"], "at least 1 MiB"),
    ],
)
def test_xjobs_worker_refuses_bad_options(args, fragment):
    with pytest.raises(CommandError) as info:
        call_command("xjobs_worker", "--burst", *args, stdout=StringIO(), stderr=StringIO())
    assert fragment in str(info.value)
    if not str(info.value).startswith("Error: argument"):  # argparse's: 2 from a shell
        assert info.value.returncode == 2


@pytest.mark.parametrize(("args", "says"), [
    (["--prefetch", "-1"], "argument --prefetch: must be 'auto' or an integer >= 0, got '-1'"),
    (["--max-jobs-per-process", "0"], "argument --max-jobs-per-process: must be a whole number "
                                      "of jobs >= 1, got '0'"),
    (["--max-memory", "512MB"], "argument --max-memory: must be a memory size of at least 1 "
                                "MiB: a number of MiB (512), or 512MiB, 1GiB; got '512MB'"),
])
def test_xjobs_worker_bounds_are_refused_from_the_command_line_as_prefetch_is(args, says,
                                                                              capsys):
    """From a shell, a bad recycling bound exits 2 with argparse's message, as --prefetch does
    (what `manage.py xjobs_worker` runs: the parser of a command called from its command
    line)."""
    from django_xjobs.management.commands.xjobs_worker import Command

    command = Command()
    command._called_from_command_line = True  # as run_from_argv sets it
    parser = command.create_parser("manage.py", "xjobs_worker")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(args)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


# ------------------------------------------------------------ exit status, a closed stdout --


def manage(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    """``python -m django ARGS`` in a process of its own on the test database, as an operator's
    shell or a probe runs it."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "XJOBS_TEST_DB_NAME": connection.settings_dict["NAME"]}
    env.pop("XJOBS_TEST_SETTINGS", None)
    return subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "code", "says"), [
    # bad usage: argparse's own, and what the command finds wrong after parsing
    (["xjobs", "nosuch"], 2, "invalid choice: 'nosuch'"),
    (["xjobs", "jobs", "--nosuch"], 2, "unrecognized arguments: --nosuch"),
    (["xjobs", "health", "--max-stall", "never"], 2, "'never' is not a duration"),
    (["xjobs", "purge", "--older-than", "soon"], 2, "CommandError: --older-than: 'soon' is not "
                                                     "a duration"),
    (["xjobs", "show", "not-a-uuid"], 2, "CommandError: 'not-a-uuid' is not a job id (a UUID)"),
    (["xjobs", "schedule", "trigger", "nope"], 2, "CommandError: no cron task named 'nope'"),
    # a verdict: no worker serves the queue asked
    (["xjobs", "health", "--queue", "nosuch"], 1, "CommandError: unhealthy: 1 problem(s)"),
])
def test_bad_usage_exits_2_and_an_unhealthy_verdict_1(args, code, says):
    done = manage(*args)
    assert done.returncode == code, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.django_db
def test_a_stdout_closed_early_ends_the_command_quietly():
    # The reader is gone before the command writes a byte (`| head -0`): the verdict is never
    # told, the command ends with 141 (128 + SIGPIPE) and no traceback.
    read, write = os.pipe()
    os.close(read)
    try:
        done = manage("xjobs", "health", "--queue", "nosuch", stdout=write)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
    # `| head -1` of more than a pipe holds (xjobs_sql prints every statement), from a shell.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    script = (f"{shlex.quote(sys.executable)} -m django xjobs_sql | head -1; "
              "echo \"status ${PIPESTATUS[0]}\"")
    shell = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
    first, status = shell.stdout.splitlines()
    assert first.startswith("-- ") and status == "status 141"
    assert shell.stderr == ""


def test_xjobs_worker_warns_of_a_queue_nothing_names_and_serves_it(spawn_worker):
    worker = spawn_worker("--burst", "--queue", "default", "nosuch")
    assert worker.wait() == 0, worker.log()
    [line] = [line for line in worker.log().splitlines() if "--queue" in line]
    assert "--queue nosuch: no registered job, XJOBS['QUEUES']" in line
    assert "(they name: " in line and "default" in line.split("(they name: ")[1]
    assert "serving it anyway" in line


# ------------------------------------------------------------------------------ xjobs_sql --


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(S.ALL))
def test_each_printed_statement_is_accepted_by_postgresql(name):
    # An operator copies a statement from xjobs_sql into psql and runs it: the PREPARE form
    # must therefore parse and type-check as printed (untyped $n parameters).
    text = as_prepare(S.ALL[name])
    prepared = text.splitlines()[1].startswith("prepare ")
    with connection.cursor() as cur:
        cur.execute("savepoint before_statement")
        try:
            if text.splitlines()[1].lower().startswith("copy"):
                # COPY ... FROM STDIN: psql reads the rows that follow; here, none.
                with cur.cursor.copy(text.split("\n", 1)[1].rstrip().rstrip(";")):
                    pass
            else:
                cur.execute(text)  # no parameters: the text goes to the server as printed
            if prepared:
                cur.execute(f"deallocate {name}")  # PREPARE outlives a rollback
        finally:
            cur.execute("rollback to savepoint before_statement")
