"""Finding the job and acting on thousands (docs/console.md, "Finding the job", "Acting on
thousands", "The same from a terminal"): the search box, the error, name and worker filters, an
action over a filter and ``manage.py xjobs retry --filter`` find the same jobs whether they are
in ``x_jobs`` or in the history tables the archive moved them to; and the history tables answer
them by their own indexes (EXPLAIN).

The jobs are driven to their states through the engine (claimed by a named worker, failed for
good with an error) and archived by the pruner's own pass, with a clock an hour ahead so that
the jobs finished just now count as old enough.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

from django_xjobs import conf
from django_xjobs.console.reads.search import count_per_table, filtered_jobs, newest_per_table
from django_xjobs.engines import get_engine
from django_xjobs.maintenance import pruner
from django_xjobs.models import Job, JobStep
from django_xjobs.records import Completion, Failure
from tests.conformance.test_flow_plans import nodes
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_xjobs_job_changelist")
CHECKBOX = "_selected_action"
QUEUE = "search-q"
LIVE_QUEUE = "search-live"


# ----------------------------------------------------------------------------------- rows --


def finished(state: str, *, job=testapp_jobs.record, worker: str = "tests:search",
             error: str = "RuntimeError: card declined", tenant: str | None = "acme",
             key: str | None = None, **job_input):
    """A job of ``job`` with ``job_input``, claimed by ``worker`` and then done, or failed for
    good (dead) with ``error`` as the last line of its traceback."""
    engine = get_engine()
    options = {"queue": QUEUE, "tenant_id": tenant}
    if key:
        options["idempotency_key"] = key
    handle = job.using(**options).enqueue(**job_input)
    (claimed,) = engine.jobs_claim(wants={QUEUE: 1}, worker_id=worker, lease_ms=60_000)
    assert claimed.id == str(handle.id)
    if state == "done":
        engine.jobs_complete_if_owned([Completion(claim=claimed.claim, result_json="{}")])
    else:
        assert state == "dead"
        engine.job_fail_if_owned(Failure(
            claim=claimed.claim, retry_delay_ms=0, permanent=True,
            error=f'Traceback (most recent call last):\n  File "shop.py", line 9\n{error}'))
    return handle


def archive() -> int:
    """The pruner's archive pass, its clock an hour ahead: every finished job moves."""
    settings = conf.build({**django_settings.XJOBS, "ARCHIVE_AFTER": "1m"})
    return pruner.archive(settings=settings, now=get_engine().db_now() + timedelta(hours=1))


def table_of(job_id) -> str:
    with connection.cursor() as cursor:
        cursor.execute("select tableoid::regclass::text from x_jobs where id = %s", [job_id])
        (row,) = cursor.fetchall()
    return row[0]


def ids_listed(response) -> list[str]:
    """The job ids of the list's rows, in the list's order."""
    assert response.status_code == 200
    return [str(j.pk) for j in response.context["cl"].result_list]


def found(admin_client, **params) -> set[str]:
    return set(ids_listed(admin_client.get(JOBS, params)))


def ids(*handles) -> set[str]:
    return {str(h.id) for h in handles}


@pytest.fixture
def spread():
    """Jobs in the history tables (archived) and in ``x_jobs``, oldest first: a live one, five
    archived (four dead, one done), then two dead ones left in x_jobs."""
    j = {}
    j["live"] = testapp_jobs.record.using(queue=LIVE_QUEUE, tenant_id="acme").enqueue(
        order_id=42)
    j["h_num"] = finished("dead", worker="web-1:4242", order_id=42,
                          customer={"email": "ada@example.com"})
    j["h_str"] = finished("dead", worker="web-1:77", error="ValueError: card expired",
                          order_id="42")
    j["h_4242"] = finished("dead", worker="web-10:1", error="RuntimeError: payment declined",
                           order_id=4242)
    j["h_done"] = finished("done", job=testapp_jobs.noop, worker="web-10:1",
                           customer={"email": "ada@example.com"})
    j["h_globex"] = finished("dead", tenant="globex", order_id=42)
    JobStep.objects.create(run_id=j["h_num"].run_id, name="charge", status="failed",
                           attempts=1, error="RuntimeError: card declined")
    assert archive() == 5
    j["r_note"] = finished("dead", worker="web-2:1", error="RuntimeError: card declined by bank",
                           order_id=7, note="42", email="ada@example.com")
    j["r_num"] = finished("dead", worker="web-2:1", error="TimeoutError: gateway timeout",
                          order_id=42, gift=True)
    for name in ("h_num", "h_str", "h_4242", "h_globex"):
        assert table_of(j[name].id).startswith("x_jobs_dead_"), name
    assert table_of(j["h_done"].id).startswith("x_jobs_done_")
    assert {table_of(j[n].id) for n in ("live", "r_note", "r_num")} == {"x_jobs"}
    return j


# --------------------------------------------------------------------------- finding jobs --


def test_the_search_box_finds_a_value_at_a_path_or_words_in_x_jobs_and_history(
        admin_client, spread):
    j = spread
    # 42 is the number and the string "42", at that path only; not 4242, not "note": "42".
    assert found(admin_client, q="order_id=42") == ids(
        j["live"], j["h_num"], j["h_str"], j["h_globex"], j["r_num"])
    assert found(admin_client, q='order_id="42"') == ids(j["h_str"])
    assert found(admin_client, q="customer.email=ada@example.com") == ids(j["h_num"],
                                                                           j["h_done"])
    # Values the words index holds no words of: by containment alone.
    assert found(admin_client, q='customer={"email": "ada@example.com"}') == ids(
        j["h_num"], j["h_done"])
    assert found(admin_client, q="gift=true") == ids(j["r_num"])
    # Words: of the input's values at any depth, or of the last error.
    assert found(admin_client, q="ada@example.com") == ids(j["h_num"], j["h_done"], j["r_note"])
    assert found(admin_client, q="expired") == ids(j["h_str"])
    assert found(admin_client, q="gateway timeout") == ids(j["r_num"])
    assert found(admin_client, q="4242") == ids(j["h_4242"])
    # The list's "last error" column: the line a person reads first, whole in its title.
    page = admin_client.get(JOBS, {"q": "expired"}).content.decode()
    assert ('<span class="xjobs-error-line" title="ValueError: card expired">'
            "ValueError: card expired</span>") in page
    assert "Traceback" not in page


def test_the_error_name_and_worker_filters_read_every_table(admin_client, spread):
    j = spread
    dead = {"h_num", "h_str", "h_4242", "h_globex", "r_note", "r_num"}
    # Every word of the error, in any order; one of them is not enough.
    assert found(admin_client, error="card declined") == ids(j["h_num"], j["h_globex"],
                                                             j["r_note"])
    assert found(admin_client, error="declined CARD", state="dead") == ids(
        j["h_num"], j["h_globex"], j["r_note"])
    # A name, or a pattern of names (* any characters, ? one).
    assert found(admin_client, name="testapp.n*") == ids(j["h_done"])
    assert found(admin_client, name="testapp.rec?rd", queue=QUEUE) == ids(
        *(j[n] for n in dead))
    assert found(admin_client, name="testapp.noop") == ids(j["h_done"])
    # A host's workers (not web-10's), or one worker by its id.
    assert found(admin_client, worker="web-1") == ids(j["h_num"], j["h_str"])
    assert found(admin_client, worker="web-1:4242") == ids(j["h_num"])
    assert found(admin_client, worker="web-10", state="done") == ids(j["h_done"])
    # An error filter without a word: said so, nothing listed.
    response = admin_client.get(JOBS, {"error": "!!! ..."})
    assert ids_listed(response) == []
    assert any("no word to look for" in str(m) for m in get_messages(response.wsgi_request))


def test_a_search_lists_the_newest_matches_first_across_x_jobs_and_history(
        admin_client, spread):
    j = spread
    matches = sorted((j[n].id for n in ("live", "h_num", "h_str", "h_globex", "r_num")),
                     reverse=True)
    # The newest is in x_jobs, the next ones in the dead jobs' history table, the oldest (a
    # live job) in x_jobs again: a limit that ends inside the history table.
    assert matches[0] == j["r_num"].id and matches[-1] == j["live"].id
    queryset, searched = filtered_jobs({"q": "order_id=42"})
    assert searched
    for limit in (1, 3, 4, 10):
        newest = newest_per_table(queryset, limit=limit).order_by("-id")
        assert list(newest.values_list("id", flat=True)) == matches[:limit], limit
    assert count_per_table(queryset, cap=3) == 3
    assert count_per_table(queryset, cap=1001) == 5
    assert ids_listed(admin_client.get(JOBS, {"q": "order_id=42"})) == [str(i) for i in matches]


def test_a_search_counts_up_to_a_floor_and_says_more_than_1000_match(admin_client):
    with connection.cursor() as cursor:
        cursor.execute("""
            insert into x_jobs (idempotency_key, name, state, input)
            select 'floor-' || g, 'testapp.record', 'ready', jsonb_build_object('batch', 'zq81')
              from generate_series(1, 1001) g""")
    response = admin_client.get(JOBS, {"q": "zq81"})
    page = response.content.decode()
    assert re.search(r'id="xjobs-estimated">More than 1000 jobs match', page), page[-3000:]
    newest = Job.objects.filter(input__batch="zq81").order_by("-id")
    per_page = response.context["cl"].list_per_page
    assert ids_listed(response) == [str(i) for i in newest.values_list("id", flat=True)[:per_page]]


def acme_only(request):
    return {"acme"}


@override_settings(XJOBS={"ADMIN_TENANT_SCOPE":
                          "tests.integration.test_console_search.acme_only"})
def test_a_tenant_scope_applies_to_searches_and_filters(admin_client, spread):
    j = spread
    assert found(admin_client, q="order_id=42") == ids(j["live"], j["h_num"], j["h_str"],
                                                       j["r_num"])
    assert found(admin_client, error="card declined") == ids(j["h_num"], j["r_note"])
    assert found(admin_client, q=str(j["h_globex"].id)) == set()


def run(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


def test_the_terminal_lists_the_jobs_the_console_finds(spread):
    j = spread

    def listed(*args: str) -> list[str]:
        return [row["id"] for row in json.loads(run("jobs", *args, "--json"))]

    assert listed("--search", "order_id=42") == sorted(
        (str(j[n].id) for n in ("live", "h_num", "h_str", "h_globex", "r_num")), reverse=True)
    assert set(listed("--worker", "web-1")) == ids(j["h_num"], j["h_str"])
    assert set(listed("--error", "card declined", "--tenant", "acme")) == ids(j["h_num"],
                                                                             j["r_note"])
    assert set(listed("--name", "testapp.n*")) == ids(j["h_done"])
    assert listed("--search", "order_id=42", "--limit", "1") == [str(j["r_num"].id)]


# -------------------------------------------------------------------- acting on thousands --


def test_retry_over_a_filter_confirms_the_count_then_retries_archived_jobs_too(
        admin_client, spread):
    j = spread
    # Dead and keyed: a live job holds its key, so the retry leaves it.
    j["k_dead"] = finished("dead", key="invoice:7", order_id=42)
    holder = testapp_jobs.record.using(queue=LIVE_QUEUE, tenant_id="acme",
                                       idempotency_key="invoice:7").enqueue()
    assert holder.created
    retried = ("h_num", "h_str", "h_globex", "r_num")
    before = {n: (table_of(j[n].id), Job.objects.get(id=j[n].id).state) for n in j}
    url = f"{JOBS}?q=order_id%3D42"
    post = {"action": "retry_jobs", CHECKBOX: [str(j["r_num"].id)], "select_across": "1",
            "index": "0"}

    confirm = admin_client.post(url, post)

    assert confirm.status_code == 200
    page = confirm.content.decode()
    # Counted among dead and cancelled jobs: the live match is not.
    assert re.search(r'id="xjobs-bulk-count">5 jobs match the filter and will be retried<',
                     page), page
    assert re.search(r'value="Yes, retry 5 jobs" id="xjobs-confirm"', page)
    assert "<code>order_id=42</code>" in page
    assert {n: (table_of(j[n].id), Job.objects.get(id=j[n].id).state) for n in j} == before
    assert not LogEntry.objects.exists()

    # What the confirmation's own form posts (to the same address, the filter in it).
    hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page))
    hidden.pop("csrfmiddlewaretoken", None)
    assert hidden["post"] == "yes" and hidden["select_across"] == "1"
    response = admin_client.post(url, hidden)

    assert response.status_code == 302
    for name in retried:
        job = Job.objects.get(id=j[name].id)
        assert (job.state, job.attempt, job.enqueued_by) == ("ready", 0, "admin:admin"), name
        assert table_of(j[name].id) == "x_jobs", name  # back in x_jobs proper
    with connection.cursor() as cursor:
        cursor.execute("select tableoid::regclass::text from x_job_steps where run_id = %s",
                       [j["h_num"].run_id])
        assert cursor.fetchall() == [("x_job_steps",)]
    assert Job.objects.get(id=j["k_dead"].id).state == "dead"
    for name in ("h_4242", "r_note"):  # not matched
        assert Job.objects.get(id=j[name].id).state == "dead"
    assert Job.objects.get(id=j["live"].id).state == "ready"
    entries = LogEntry.objects.all()
    assert sorted(e.object_id for e in entries) == sorted(str(j[n].id) for n in retried)
    assert {e.change_message for e in entries} == {"Retried now by admin:admin (over a filter)"}
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert message.startswith("Retried 4 of the 5 matching dead/cancelled jobs, in 1 batch"), \
        message
    assert "1 were left" in message and "a live job holds their key" in message


def test_an_action_over_a_filter_needs_the_actions_own_permission(client, spread):
    user = User.objects.create_user("oncall", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_xjobs", codename__in=("view_job", "cancel_job")))
    client.force_login(user)
    post = {"action": "retry_jobs", CHECKBOX: [str(spread["r_num"].id)],
            "select_across": "1", "index": "0"}
    for extra in ({}, {"post": "yes"}):
        response = client.post(f"{JOBS}?q=order_id%3D42", {**post, **extra})
        assert response.status_code == 403
    assert Job.objects.get(id=spread["r_num"].id).state == "dead"
    assert table_of(spread["h_num"].id).startswith("x_jobs_dead_")
    assert not LogEntry.objects.exists()


# ---------------------------------------------------------------------- from a terminal --


def test_xjobs_retry_over_a_filter_counts_then_retries_and_a_worker_runs_them(spawn_worker):
    archived = finished("dead", order_id=42)
    assert archive() == 1
    recent = finished("dead", order_id="42")
    other = finished("dead", order_id=43)
    query = "state=dead&q=order_id=42"

    out = run("retry", "--filter", query)

    assert out.strip() == ("2 dead/cancelled job(s) match; run again with --yes to retry "
                           "them")
    assert {Job.objects.get(id=h.id).state for h in (archived, recent, other)} == {"dead"}
    assert table_of(archived.id).startswith("x_jobs_dead_")

    out = run("retry", "--filter", query, "--yes")

    assert out.startswith("retried 2 of 2 matching dead/cancelled job(s) in 1 batch(es)"), out
    for handle in (archived, recent):
        job = Job.objects.get(id=handle.id)
        assert job.state == "ready" and job.enqueued_by.startswith("cli"), job.enqueued_by
    assert table_of(archived.id) == "x_jobs"

    worker = spawn_worker("--burst", "--queue", QUEUE)
    assert worker.wait(60) == 0, worker.log()

    for handle in (archived, recent):
        job = Job.objects.get(id=handle.id)
        assert (job.state, job.result) == ("done", {"tag": "", "attempt": 1}), worker.log()
    assert Job.objects.get(id=other.id).state == "dead"


def test_bad_usage_of_an_action_over_a_filter_exits_2():
    dead = finished("dead", order_id=1)
    some_id = "00000000-0000-7000-8000-000000000001"
    for args in (["retry"],  # neither ids nor a filter
                 ["retry", "--filter", "nosuch=1"],
                 ["retry", "--filter", "state=sleepy"],
                 ["retry", some_id, "--yes"],  # --yes without --filter
                 ["retry", some_id, "--filter", "state=dead"],
                 ["cancel", "--filter", "error=!!!", "--yes"]):
        with pytest.raises(CommandError) as info:
            run(*args)
        assert info.value.returncode == 2, (args, str(info.value))
    assert Job.objects.get(id=dead.id).state == "dead"


# ------------------------------------------------------------------------------- plans --

HISTORY_ROWS = 3000


def explained(sql: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"explain (analyze, format json) {sql}")
        [[[plan]]] = cursor.fetchall()
    return plan["Plan"]


def sent_to(queries, table: str) -> list[str]:
    """The statements of ``queries`` that read ``table`` alone (newest_per_table's reads, and
    count_per_table's, which reads each table in its own branch)."""
    sent = [q["sql"] for q in queries if f'FROM ONLY "{table}"' in q["sql"]]
    assert sent, [q["sql"] for q in queries]
    return sent


def indexes_used(plan: dict) -> set[str]:
    return {n["Index Name"] for n in nodes(plan) if "Index Name" in n}


def test_a_history_table_answers_words_errors_and_names_by_its_own_indexes(admin_client):
    """A dead jobs' history table of a few thousand rows, analyzed: the per-table reads of a
    rare word of the input and of an error's rare word use its ``_input_words_idx`` and
    ``_error_words_idx``; the ordered read of a name pattern (a table read newest first above
    the newest match found in x_jobs) its ``_name_idx``: the indexes exist and match the
    expressions and conditions the search writes. (ANALYZE samples every row of a table this
    small, so the planner's statistics, and these plans, are the same on every run.)"""
    with connection.cursor() as cursor:
        cursor.execute("select xjobs_history_table('dead', current_date - 3)")
        (table,) = cursor.fetchone()
        cursor.execute(f"""
            insert into "{table}" (idempotency_key, name, queue, state, input, last_error,
                                   claimed_by, finished_at)
            select g::text || '-k', 'shop.order_' || (g %% 10), 'q' || (g %% 3), 'dead',
                   jsonb_build_object('order_id', g, 'sku', 'sku-common',
                                      'note', case when g = 77 then 'zebra' else 'plain' end),
                   'RuntimeError: card declined'
                       || case when g = 1234 then ' by okapi' else '' end,
                   'web-' || (g %% 5) || ':1', now()
              from generate_series(1, %s) g""", [HISTORY_ROWS])
        cursor.execute(f"""
            insert into "{table}" (idempotency_key, name, state, finished_at)
            select 'rare-' || g, 'billing.invoice_' || g, 'dead', now()
              from generate_series(1, 3) g""")
        # In x_jobs: a match older than every row of the history table (its id the least
        # there is), and the newest row of all, which matches nothing.
        cursor.execute("""
            insert into x_jobs (id, idempotency_key, name, state, finished_at) values
            ('00000000-0000-7000-8000-000000000001', 'old', 'billing.invoice_0', 'dead', now()),
            ('ffffffff-ffff-7fff-bfff-ffffffffffff', 'new', 'shop.order_1', 'dead', now())""")
        cursor.execute(f'analyze "{table}"')
        cursor.execute("select indexname from pg_indexes where tablename = %s", [table])
        indexes = {r[0] for r in cursor.fetchall()}
        steps = table.replace("x_jobs_", "x_job_steps_")
        cursor.execute("select indexname from pg_indexes where tablename = %s", [steps])
        step_indexes = {r[0] for r in cursor.fetchall()}
        cursor.execute(f'select id from "{table}" where name like %s order by id desc limit 1',
                       ["billing.%"])
        (newest_billing,) = cursor.fetchone()
    assert {f"{table}_{s}" for s in ("queue_idx", "name_idx", "tenant_idx", "worker_idx",
                                     "input_words_idx", "error_words_idx")} <= indexes
    assert f"{steps}_status_idx" in step_indexes

    for params, index in (({"q": "zebra"}, "input_words_idx"),
                          ({"error": "okapi"}, "error_words_idx")):
        with CaptureQueriesContext(connection) as queries:
            assert len(ids_listed(admin_client.get(JOBS, params))) == 1, params
        for sql in sent_to(queries, table):
            assert f"{table}_{index}" in indexes_used(explained(sql)), (params, sql)

    queryset, searched = filtered_jobs({"name": "billing.*"})
    assert searched
    with CaptureQueriesContext(connection) as queries:
        newest = list(newest_per_table(queryset, limit=1).values_list("id", flat=True))
    assert newest == [newest_billing]
    (ordered,) = [sql for sql in sent_to(queries, table) if "ORDER BY" in sql]
    assert f"{table}_name_idx" in indexes_used(explained(ordered)), ordered


@pytest.mark.django_db
def test_the_console_reads_without_jit_and_puts_the_sessions_setting_back(admin_client):
    """A list over the history tables can cost past jit_above_cost, and compiling it costs more
    than it saves (docs/console.md, "At ten million jobs"): the page's reads run with JIT off,
    the session's setting is restored after it."""
    with connection.cursor() as cursor:
        cursor.execute("set jit = on")
    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql if "set_config('jit'" not in sql else f"JIT {params}")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert admin_client.get("/admin/django_xjobs/job/?q=order_id%3D42").status_code == 200
    reads = [n for n, sql in enumerate(statements) if 'FROM "x_jobs"' in sql
             or "FROM ONLY" in sql]
    switches = [n for n, sql in enumerate(statements) if sql.startswith("JIT")]
    assert reads and switches and switches[0] < min(reads) and switches[-1] > max(reads)
    assert statements[switches[-1]] == "JIT ['on']"
    with connection.cursor() as cursor:
        cursor.execute("show jit")
        assert cursor.fetchone()[0] == "on"


@pytest.mark.django_db
def test_hundreds_of_job_names_are_suggestions_not_a_page_of_links(admin_client):
    """The job name filter lists the registered names as links up to a dozen; past that (the
    test app registers more), as the text box's suggestions (a datalist), which the browser
    narrows as one types; the queue filter, with a few queues, keeps its links."""
    from django_xjobs import registry

    names = sorted(registry.all_jobs())
    assert len(names) > 12
    page = admin_client.get(JOBS).content.decode()
    datalist = page.split('<datalist id="xjobs-name-choices">', 1)[1].split("</datalist>")[0]
    assert all(f'<option value="{name}">' in datalist for name in names)
    assert f'href="?name={names[0]}"' not in page
    assert 'list="xjobs-queue-choices"' not in page and 'href="?queue=default"' in page


@pytest.mark.django_db
def test_the_error_column_names_the_exceptions_class_without_its_module(admin_client):
    from tests.console_data import job_in_state

    dead = job_in_state("dead", error="billing.errors.CardDeclined: over the card limit")
    page = admin_client.get(JOBS, {"q": str(dead.id)}).content.decode()
    assert ('<span class="xjobs-error-line" title="billing.errors.CardDeclined: over the card '
            'limit">CardDeclined: over the card limit</span>') in page
