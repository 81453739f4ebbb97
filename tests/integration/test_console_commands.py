"""CLI parity: what the console shows, ``manage.py xjobs`` shows too, as text and as JSON."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_xjobs.engines import get_engine
from django_xjobs.models import Job
from tests.console_data import (
    job_in_state,
    jobs_in_every_state,
    other_rows,
    slot_held_by_a_run,
    steps_for,
)

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


def run_json(*args: str):
    return json.loads(run(*args, "--json"))


@pytest.fixture
def one_of_each():
    handles = jobs_in_every_state("cli-q", tenant_id="acme")
    steps_for(handles["suspended"].run_id)
    other_rows()
    return handles


def test_dashboard_json_has_every_panel_of_the_console(one_of_each):
    get_engine().worker_seen("tests:console", "host-c", 7, ["cli-q"], version="9.9",
                             concurrency=4, running=2, finished=11, claimed_age=1.0,
                             loop_age=0.1)
    data = run_json("dashboard")
    (q,) = [r for r in data["queues"] if r["queue"] == "cli-q"]
    assert {k: q[k] for k in ("ready", "delayed", "running", "suspended", "blocked")} == {
        "ready": 1, "delayed": 1, "running": 2, "suspended": 1, "blocked": 0}
    assert (q["done_24h"], q["failed_24h"], q["dead_24h"], q["cancelled_24h"]) == (1, 1, 1, 1)
    assert q["live"] == 5
    assert data["outbox_pending"] == 1
    assert [leader["holder"] for leader in data["leaders"]] == ["w1:1"]
    assert data["schedules"][0]["task"] == "nightly-report"
    assert data["schedules"][0]["next_fire_at"] is None
    (worker,) = [w for w in data["workers"] if w["id"] == "tests:console"]  # x_workers
    assert (worker["running"], worker["finished"], worker["stalled"]) == (2, 11, None)
    assert [f["id"] for f in data["failures"]] == [str(one_of_each["dead"].id)]
    assert data["failures"][0]["error"] == "RuntimeError: card declined"


def test_dashboard_text_shows_queues_outbox_scheduler_workers_and_failures(one_of_each):
    get_engine().worker_seen("tests:console", "host-c", 7, ["cli-q"], version="9.9",
                             concurrency=4, running=2, finished=11, claimed_age=1.0,
                             loop_age=0.1)
    out = run("dashboard")
    for text in ("cli-q", "outbox: 1 pending", "scheduler leader (xjobs-scheduler): w1:1",
                 "nightly-report", "tests:console", "RuntimeError: card declined"):
        assert text in out, text


def test_health_json_shows_lapsed_leases_rescues_tables_and_holders(one_of_each):
    data = run_json("health")
    assert data["lapsed_count"] == 1
    assert data["lapsed"][0]["id"] == str(one_of_each["lapsed"].id)
    assert {t["health"]["table"] for t in data["tables"]} >= {"x_jobs", "x_outbox"}
    assert data["verdict"] in ("warn", "bad")
    assert {"live_jobs", "finished_jobs", "by_name"} <= set(data["rescues"])
    assert "running jobs whose lease expired: 1" in run("health")


def test_workers_lists_the_worker_processes_and_their_status():
    # x_workers as the heartbeat writes it; tests/integration/test_workers.py judges "stalled".
    get_engine().worker_seen("tests:console", "host-c", 7, ["cli-q"], version="9.9",
                             concurrency=4, running=2, finished=11, claimed_age=1.0,
                             loop_age=0.1)
    (worker,) = run_json("workers")
    assert (worker["id"], worker["running"], worker["finished"], worker["stalled"]) == (
        "tests:console", 2, 11, None)
    (line,) = [ln for ln in run("workers").splitlines() if ln.startswith("tests:console")]
    assert line.split()[1:7] == ["host-c", "7", "cli-q", "9.9", "2/4", "11"]
    assert line.endswith("ok")


def test_jobs_lists_with_the_consoles_filters(one_of_each):
    dead = run_json("jobs", "--state", "dead", "--queue", "cli-q")
    assert [j["id"] for j in dead] == [str(one_of_each["dead"].id)]
    assert {j["id"] for j in run_json("jobs", "--tenant", "acme")} == {
        str(h.id) for h in one_of_each.values()}
    assert run_json("jobs", "--name", "testapp.nothing") == []
    future = run_json("jobs", "--run-after", "2999-01-01T00:00:00Z")
    assert future == []
    assert str(one_of_each["dead"].id) in run("jobs", "--state", "dead")
    with pytest.raises(CommandError):
        run("jobs", "--created-after", "yesterday")


def test_why_explains_a_job_as_the_detail_page_does(one_of_each):
    data = run_json("why", str(one_of_each["lapsed"].id))
    assert data["job"]["id"] == str(one_of_each["lapsed"].id)
    assert any("Its lease expired" in line for line in data["diagnosis"])
    waiting = run("why", str(one_of_each["suspended"].id))
    assert "waiting for event 'user.verified'" in waiting


def test_steps_outbox_slots_backfills_and_scheduler_are_listed(one_of_each):
    run_id = str(one_of_each["suspended"].run_id)
    steps = run_json("steps", "--run-id", run_id)
    assert {s["name"] for s in steps} == {"fetch-profile", "charge", "wait-verified"}
    assert [s["name"] for s in run_json("steps", "--status", "waiting")] == ["wait-verified"]
    assert len(run_json("outbox", "--pending")) == 1 and run_json("outbox", "--published") == []
    (backfill,) = run_json("backfills")
    assert backfill["rows_processed"] == 12_000 and backfill["rows_per_second"] > 0
    # The console's slot and scheduler pages are the slots' and the scheduler's own commands.
    assert [s["key"] for s in run_json("slots")] == ["tenant:acme"]
    assert "nightly-report" in {t["name"] for t in run_json("schedule")["tasks"]}
    for command in ("steps", "outbox", "slots", "backfills", "schedule"):
        assert run(command).strip(), command


def test_delete_removes_finished_jobs_only(one_of_each):
    ids = [str(one_of_each[s].id) for s in ("done", "dead", "ready")]
    assert run_json("delete", *ids) == {"deleted": 2, "asked": 3}
    assert set(Job.objects.filter(id__in=ids).values_list("state", flat=True)) == {"ready"}
    with pytest.raises(CommandError, match="not a job id"):
        run("delete", "nope")


def test_why_of_an_unknown_job_is_a_command_error():
    with pytest.raises(CommandError, match="no job with id"):
        run("why", "0190a1b2-0000-7000-8000-000000000000")


def test_the_console_commands_work_on_an_empty_database():
    assert run_json("dashboard")["failures"] == []
    assert "(no worker seen in the last day)" in run("workers")
    assert "(no jobs)" in run("jobs")
    assert run_json("health")["lapsed_count"] == 0


def test_a_retry_from_the_command_line_keeps_who_enqueued_the_job():
    handle = job_in_state("dead", enqueued_by="user:ada")
    run("retry", str(handle.id))
    assert Job.objects.get(id=handle.id).enqueued_by == "user:ada"


def test_stats_and_slots_show_the_limit_a_jobs_own_concurrency_gives():
    from django.test.utils import override_settings

    from django_xjobs.engines import get_engine
    from django_xjobs.records import SlotRequest

    slot_held_by_a_run("g")  # Concurrency(key="slot:{group}", limit=2); no settings limit
    # A holder that names no job (written by hand, or its job is gone): no limit known.
    get_engine().slots_acquire([SlotRequest(slot_key="other:x", limit=1, holder="w-9")],
                               60_000)

    assert "slot:g  1 / 2" in run() and "other:x  1 / -" in run()
    by_key = {s["key"]: s for s in run_json()["slots"]}
    assert (by_key["slot:g"]["limit"], by_key["other:x"]["limit"]) == (2, None)
    listed = {s["key"]: s for s in run_json("slots")}
    assert (listed["slot:g"]["limit"], listed["other:x"]["limit"]) == (2, None)
    table = run("slots").splitlines()
    assert "limit" in table[0]
    (row,) = [line for line in table if line.startswith("slot:g")]
    assert row.split()[2] == "2"
    with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"slot:": 5, "other:": 3}}):
        assert "slot:g  1 / 5" in run() and "other:x  1 / 3" in run()
