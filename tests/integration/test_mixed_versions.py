"""Old and new versions side by side (docs/deployment.md, "Mixed versions"): while x_fleet keeps
the fleet compatible with release 0.1, this version writes nothing 0.1 cannot read (no
`blocked` state, no move into the history tables), and `manage.py xjobs fleet` shows, finishes
and re-opens that compatibility. tests/acceptance/test_upgrade.py runs 0.1's own processes
beside this version's."""

from __future__ import annotations

import dataclasses
import importlib
import io
import re
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from django_xjobs import conf, registry, versions
from django_xjobs.console.reads.health import OK, health
from django_xjobs.console.reads.text import db_now
from django_xjobs.engines import get_engine
from django_xjobs.maintenance import pruner
from django_xjobs.models import Job
from django_xjobs.records import FleetRecord
from django_xjobs.worker.flow import Flow, claim_flow
from tests.conformance.conftest import make_row
from tests.integration.test_blocked import KEY, hold, unblock
from tests.integration.test_history import settings_with
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

RECORD_UPGRADE = importlib.import_module("django_xjobs.migrations.0012_fleet").RECORD_UPGRADE


def keep_compatible(series: str | None = "0.1") -> None:
    get_engine().fleet_set(compatible_with=series, changed_by="tests")


def xjobs(*args: str) -> str:
    out = io.StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


def worker_flow() -> Flow:
    return Flow(engine=get_engine(), settings=conf.get(), worker_id="w-mixed",
                queues=["default"], poll_interval=0.5, stats=Counter())


# ------------------------------------------------------------------------- the rule --

def test_a_database_no_earlier_version_used_needs_no_compatibility():
    assert get_engine().fleet_get() == FleetRecord()
    assert versions.writes("blocked", FleetRecord())
    assert versions.held_back(FleetRecord()) == []


def test_the_upgrade_migration_keeps_tables_an_earlier_version_used_compatible_with_it():
    with connection.cursor() as cursor:
        cursor.execute(RECORD_UPGRADE)  # empty tables: nothing older shared them
        assert get_engine().fleet_get().compatible_with is None
        make_row(get_engine(), state="done")
        cursor.execute(RECORD_UPGRADE)
    record = get_engine().fleet_get()
    assert record.compatible_with == "0.1"
    assert "migration 0012" in record.changed_by
    assert not versions.writes("blocked", record) and not versions.writes("history", record)


@pytest.mark.parametrize("text, error", [
    ("0.2", "cannot stay compatible with '0.2'"),
    ("zero", "'zero' is not a release series"),
    ("", "'' is not a release series"),
])
def test_a_series_this_version_cannot_stay_compatible_with_is_refused(text, error):
    with pytest.raises(ValueError, match=error):
        versions.parse_series(text)
    assert versions.parse_series("0.1.7") == "0.1"


# ------------------------------------------------------------------ what is held back --

def test_a_claim_kept_compatible_leaves_a_job_without_a_slot_due_instead_of_blocked():
    hold()  # both slots of the key held elsewhere
    handle = jobs.slotted.enqueue(group=KEY.removeprefix("slot:"), seconds=0)
    flow = dataclasses.replace(claim_flow(conf.get(), registry.all_jobs().values(), ["default"]),
                               park=False, hold_ms=60_000)
    batch = get_engine().jobs_claim(wants={"default": 10}, worker_id="w-mixed", lease_ms=30_000,
                                    flow=flow)
    assert list(batch) == [] and batch.held == 1
    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.blocked_on, row.attempt) == ("delayed", None, 0)
    assert row.run_at - db_now() > timedelta(seconds=50)  # hold_ms later, not at once
    # 0.1's conflict read finds it among the four live states it knows.
    assert row.state in ("ready", "delayed", "running", "suspended")


def test_a_worker_reads_the_compatibility_before_its_first_claim_and_after_a_change():
    hold()
    keep_compatible("0.1")
    flow = worker_flow()
    handle = jobs.slotted.enqueue(group=KEY.removeprefix("slot:"), seconds=0)
    assert list(flow.claim({"default": 10}, 30_000)) == []
    assert not flow.params.park and flow.params.hold_ms == 500
    assert Job.objects.get(pk=handle.id).state == "delayed"

    keep_compatible(None)
    Job.objects.filter(pk=handle.id).update(run_at=db_now())
    flow._fleet_read_at = None  # as FLEET_REFRESH later
    assert list(flow.claim({"default": 10}, 30_000)) == []
    assert flow.params.park
    assert Job.objects.get(pk=handle.id).state == "blocked"


def test_kept_compatible_the_safety_net_wakes_every_blocked_job_room_or_not():
    """Before a rollback to 0.1, whose workers never wake a blocked job: the jobs already
    parked go back to their queue although their key has no room."""
    hold()
    handles = [jobs.slotted.enqueue(group=KEY.removeprefix("slot:"), seconds=0) for _ in range(3)]
    flow = claim_flow(conf.get(), registry.all_jobs().values(), ["default"])
    get_engine().jobs_claim(wants={"default": 10}, worker_id="w-mixed", lease_ms=30_000,
                            flow=flow)
    assert {Job.objects.get(pk=h.id).state for h in handles} == {"blocked"}
    assert unblock() == 0  # no room: parked jobs stay parked

    woken = get_engine().jobs_unblock(dataclasses.replace(flow, park=False))
    assert woken == 3
    assert {Job.objects.get(pk=h.id).state for h in handles} == {"ready"}


def test_kept_compatible_the_maintenance_moves_no_finished_job_into_history():
    make_row(get_engine(), state="done", finished_at=db_now() - timedelta(hours=1))
    keep_compatible("0.1")
    assert pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m")) == 0
    assert get_engine().history_tables() == []
    keep_compatible(None)
    assert pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m")) == 1


# --------------------------------------------------------------------- the command --

def test_the_fleet_command_shows_finishes_and_reopens_the_compatibility():
    assert "compatibility: none needed" in xjobs("fleet")
    out = xjobs("fleet", "--compatible-with", "0.1")
    assert "kept compatible with 0.1" in out and "`blocked`" in out and "history" in out
    assert get_engine().fleet_get().compatible_with == "0.1"
    assert "fleet" in get_engine().fleet_get().changed_by

    report = health()
    assert report.verdict != OK and len(report.held_back) == 2
    assert "mixed versions: the fleet is kept compatible with 0.1" in xjobs("health")

    assert "compatibility: none needed" in xjobs("fleet", "--finish-upgrade")
    assert get_engine().fleet_get().compatible_with is None
    assert health().held_back == []


def test_finish_upgrade_refuses_while_a_worker_of_an_older_version_is_seen():
    major, minor = versions.SERIES.split(".")
    older = f"{major}.{int(minor) - 1}.0"  # the series before this version's
    keep_compatible("0.1")
    get_engine().worker_seen("old-worker", "host-a", 1, ["default"], version=older,
                             concurrency=4, running=0, finished=0, claimed_age=None,
                             loop_age=0.0)
    with pytest.raises(CommandError, match=rf"1 worker\(s\) of an older version .*old-worker "
                                           rf"\({re.escape(older)}\).*nothing was changed"):
        xjobs("fleet", "--finish-upgrade")
    assert get_engine().fleet_get().compatible_with == "0.1"
    xjobs("fleet", "--finish-upgrade", "--force")
    assert get_engine().fleet_get().compatible_with is None


@pytest.mark.parametrize("bad", ["0.3", "1", "latest"])
def test_a_bad_series_changes_nothing(bad):
    with pytest.raises(CommandError, match=r"--compatible-with: .*nothing was changed"):
        xjobs("fleet", "--compatible-with", bad)
    assert get_engine().fleet_get() == FleetRecord()


def test_the_console_health_panel_says_what_is_held_back(admin_client):
    assert "xjobs-mixed-versions" not in admin_client.get(
        reverse("admin:django_xjobs_health")).content.decode()
    keep_compatible("0.1")
    panel = admin_client.get(reverse("admin:django_xjobs_health")).content.decode()
    assert "Mixed versions: kept compatible with 0.1" in panel
    assert "is not parked in `blocked`" in panel and "history tables" in panel
    assert "manage.py xjobs fleet --finish-upgrade" in panel


def test_the_fleet_command_answers_in_json():
    keep_compatible("0.1")
    out = xjobs("fleet", "--json")
    assert '"compatible_with": "0.1"' in out and f'"series": "{versions.SERIES}"' in out
