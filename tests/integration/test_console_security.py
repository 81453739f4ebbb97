"""What a view-only console user sees: never another database session's SQL (it carries
literals: a card number, a password), never a record type its permissions do not open.

The "support (view only)" group of docs/console.md (every view permission of the app) is the
user these tests log in as; superusers and holders of ``django_xjobs.view_query_text`` see the
SQL whole.
"""

from __future__ import annotations

import json
import threading
from io import StringIO

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.db import connections, transaction
from django.urls import reverse

from django_xjobs.console.reads.health import redact_query
from django_xjobs.engines import get_engine
from django_xjobs.models import JobStep
from tests.console_data import job_in_state, steps_for

pytestmark = pytest.mark.django_db

HEALTH = reverse("admin:django_xjobs_health")
SECRET = "4111-1111-1111-1111-cvv-737"
LABEL = "xjobs-tests-secret-holder"


def support_user(username: str = "support", *extra: str) -> User:
    """A member of the docs' "support (view only)" group: every view permission of the app."""
    group, _ = Group.objects.get_or_create(name="support")
    group.permissions.set(Permission.objects.filter(content_type__app_label="django_xjobs",
                                                    codename__startswith="view_")
                          .exclude(codename="view_query_text"))
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.groups.add(group)
    if extra:
        user.user_permissions.add(*Permission.objects.filter(
            content_type__app_label="django_xjobs", codename__in=extra))
    return user


@pytest.fixture
def session_with_a_secret():
    """Another session, idle inside a transaction whose last statement has a literal secret:
    the health panel lists it among what holds VACUUM back, with its query."""
    opened, release = threading.Event(), threading.Event()

    def idle_in_transaction() -> None:
        try:
            get_engine().session_label(LABEL)
            with transaction.atomic(), connections["default"].cursor() as cursor:
                cursor.execute(f"select '{SECRET}'::text as card_number")
                opened.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=idle_in_transaction)
    thread.start()
    try:
        assert opened.wait(30)
        yield
    finally:
        release.set()
        thread.join(30)


def holder_of(response):
    (row,) = [r for r in response.context["health"].holders if r.holder.name == LABEL]
    return row


def test_a_view_only_user_sees_the_first_word_of_another_sessions_sql_only(
        client, session_with_a_secret):
    client.force_login(support_user())
    response = client.get(HEALTH)
    assert response.status_code == 200
    page = response.content.decode()
    assert SECRET not in page and "card_number" not in page
    row = holder_of(response)
    assert row.holder.query == "SELECT …" and row.query_hidden
    assert SECRET not in repr(response.context["health"])
    assert 'id="xjobs-query-hidden"' in page


def test_superusers_and_holders_of_view_query_text_see_the_sql(
        client, admin_client, session_with_a_secret):
    assert SECRET in admin_client.get(HEALTH).content.decode()
    client.force_login(support_user("dba", "view_query_text"))
    response = client.get(HEALTH)
    assert SECRET in response.content.decode()
    assert not holder_of(response).query_hidden
    assert 'id="xjobs-query-hidden"' not in response.content.decode()


def test_the_command_line_shows_the_sql_to_whoever_holds_the_database_credentials(
        session_with_a_secret):
    # manage.py runs with the project's settings, database password included: nothing to hide
    # from that reader (docs/console.md, "Permissions").
    out = StringIO()
    call_command("xjobs", "health", "--json", stdout=out)
    (row,) = [h for h in json.loads(out.getvalue())["holders"] if h["holder"]["name"] == LABEL]
    assert SECRET in row["holder"]["query"] and row["query_hidden"] is False


@pytest.mark.parametrize(("query", "shown"), [
    (f"select '{SECRET}'", "SELECT …"),
    ("  UPDATE accounts SET password = 'hunter2'", "UPDATE …"),
    ("set app.api_key = sk_live_123", "SET …"),
    ("/* sk_live_123 */ select 1", "…"),
    ("sk_live_123", "…"),
    ("selectsk_live_123", "…"),
    ("with x as (select 1) select * from x", "WITH …"),
    ("", ""),
    (None, None),
])
def test_redaction_keeps_only_a_known_first_word(query, shown):
    assert redact_query(query) == shown


def test_step_records_on_a_job_page_need_the_steps_view_permission(client):
    handle = job_in_state("suspended", queue="perm-q")
    steps_for(handle.run_id)
    step = JobStep.objects.get(run_id=handle.run_id, name="fetch-profile")
    page_url = reverse("admin:django_xjobs_job_change", args=[handle.id])

    only_jobs = User.objects.create_user("jobs-only", password="pw", is_staff=True)
    only_jobs.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(only_jobs)
    page = client.get(page_url).content.decode()
    assert "ada@example.com" not in page and "gateway timeout" not in page
    assert "recorded 3 durable steps" in page
    step_json = reverse("admin:django_xjobs_jobstep_json", args=[step.pk, "output"])
    assert client.get(step_json).status_code == 403

    client.force_login(support_user())
    page = client.get(page_url).content.decode()
    assert "ada@example.com" in page
    assert client.get(step_json).status_code == 200
