"""The tables, as Django models: the schema source for migrations and the admin's reads.

Queue state is never written through these models: every write goes through the engine's
fenced statements (``engines/postgres/statements/``). The models exist so that migrations,
the admin and ad-hoc ORM reads work as a Django developer expects. The managers of ``Job``,
``JobLease`` and ``SchedulerLeader`` also reach those statements, through the engine
(``Job.objects.claim(...)``; django_xjobs/managers.py, docs/managers.md).

Index notes (each index on ``x_jobs`` costs every claim and ack a write, because those updates
change indexed columns and cannot be HOT updates; so only what a statement needs is indexed):

* ``x_jobs_live_key_uniq``: one LIVE job per (name, tenant, key); the ``on conflict`` target of
  enqueue. The tenant enters as ``coalesce(tenant_id, '')`` so a NULL tenant is one tenant.
  Rows whose key is their own id (no key given) are left out: they cannot conflict.
* ``x_jobs_claim_idx``: the claim's due-job scan, per queue in (priority desc, run_at) order,
  over the states a claim may pick; rows leave it when claimed.
* ``x_jobs_lapsed_idx``: running rows by lease expiry, the claim's rescue branch.
* ``x_jobs_finished_idx``: finished rows by finish time, for retention deletes.
* ``x_jobs_key_idx``: keyed rows by key, in every state: the console's search by key.
* ``x_jobs_run_apart_idx``: run ids of the rows whose id and run id were not minted together
  (never the API's or the outbox's jobs): the console's search by run id (RUN_ID_APART).
* ``x_jobs_console_brin``: a BRIN summary (about 1.5 kB per 128 table pages) of name, queue,
  tenant, created_at and run_at, for the console's filters at ten million jobs
  (docs/console.md, "At ten million jobs"). Not b-trees: a b-tree gets an entry from every
  insert, claim and ack (they are not HOT updates), a BRIN summary is rewritten only when a row
  lands in a range of pages a vacuum has summarized (the table's end is not) and its values
  widen that summary.
* ``x_jobs_cron_live_idx``: the live runs of each cron task by ``enqueued_by``
  (``cron:<task>``), for the overlap policies (docs/scheduling.md, "Overlap"); rows of other
  jobs have no entry.
* ids are UUIDv7, so "newest first" in the admin is the primary key in reverse.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.db.models import F, Func, Q, Value
from django.db.models.functions import Cast, Coalesce, Left, Now
from django.db.models.lookups import Exact, IsNull

from .managers import JobManager, LeaderManager, SlotManager
from .records import ALL_STATES, LIVE_STATES, TERMINAL_STATES, JobState

STATE_CHOICES = [(s.value, s.value) for s in JobState]

# A job enqueued without a key has its own id as key: it can never conflict, so it needs no
# entry in the live-key index. Leaving those rows out makes their insert a plain INSERT and
# spares the index an entry on every claim and ack of them (docs/performance.md).
DEFAULT_KEY_EXCLUDED = ~Q(idempotency_key=Cast(F("id"), models.TextField()))

# The API mints a job's id and run id in one call (records.new_ids), so both UUIDv7s carry the
# same millisecond: the first 13 characters of their text (the 48-bit timestamp) agree, and the
# console finds the job by run id in the primary-key range of that millisecond
# (console.jobs.run_id_match). The rows where they differ (written by hand, with random uuids)
# are the only ones that need an index on run_id to be found without reading the table.
RUN_ID_APART = ~Q(Exact(Left(Cast(F("run_id"), models.TextField()), 13),
                        Left(Cast(F("id"), models.TextField()), 13)))


class TransactionNow(Func):
    """``now()``: the start of the transaction, the clock every queue statement compares with.

    A due-now default must not be later than the ``now()`` of a claim in the same transaction,
    which Django's ``Now()`` (``statement_timestamp()``) can be.
    """

    template = "now()"
    output_field = models.DateTimeField()


class GenRandomUUID(Func):
    """``gen_random_uuid()`` (PostgreSQL 13+), as a column's database default."""

    template = "gen_random_uuid()"
    output_field = models.UUIDField()


class BrinIndex(models.Index):
    """An index ``using brin`` (Django's own, in ``django.contrib.postgres``, would make every
    project list that app in INSTALLED_APPS)."""

    suffix = "brin"

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        return super().create_sql(model, schema_editor, using=" USING brin", **kwargs)


class Job(models.Model):
    # Database defaults (db_default) make a hand-written INSERT work with the columns that matter;
    # the engine's statements set every column they care about explicitly.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=GenRandomUUID(),
                          editable=False)
    name = models.TextField()
    queue = models.TextField(default="default", db_default="default")
    input = models.JSONField(default=dict, db_default=Value({}, models.JSONField()))
    idempotency_key = models.TextField()
    run_id = models.UUIDField(default=uuid.uuid4, db_default=GenRandomUUID())
    attempt = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField(default=3, db_default=3)
    state = models.TextField(choices=STATE_CHOICES, default=JobState.READY.value,
                             db_default=JobState.READY.value)
    run_at = models.DateTimeField(db_default=TransactionNow())
    visible_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.TextField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    tenant_id = models.TextField(null=True, blank=True)
    traceparent = models.TextField(null=True, blank=True)
    enqueued_by = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # Priority, result, the fence and timings: docs/design.md, "x_jobs".
    priority = models.IntegerField(default=0, db_default=0)
    result = models.JSONField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    concurrency_key = models.TextField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    rescues = models.IntegerField(default=0, db_default=0)
    worker_ids = models.JSONField(default=list, db_default=Value([], models.JSONField()))
    # ---- flow control (docs/flow-control.md) ----
    # The job's rate-limit key, formatted at enqueue like concurrency_key; the limit, period
    # and cost come from its job's RateLimit when a worker claims it.
    rate_key = models.TextField(null=True, blank=True)
    # While ``blocked``: the key it waits on (a full concurrency key, a paused key), and
    # whether it goes back to ``suspended`` (a durable run's resume) rather than ``ready``.
    blocked_on = models.TextField(null=True, blank=True)
    blocked_resume = models.BooleanField(default=False, db_default=False)
    # ---- observability (docs/observability.md) ----
    # One entry per run that ended without finishing the job (attempt, worker, started_at,
    # finished_at, outcome, error), appended by the statement that settled it: the first and
    # the newest 20 are kept. The run that finished it is the row itself
    # (records.attempt_history reads both).
    attempts = models.JSONField(default=list, db_default=Value([], models.JSONField()))
    # The run's last ctx.progress(): {"done", "total", "message", "at"}.
    progress = models.JSONField(null=True, blank=True)
    # ---- durable execution, further (docs/durable.md) ----
    # A child job (ctx.step.invoke / gather): the parent job and the parent's step that waits
    # for it. Its finish wakes the parent, in the same transaction (xjobs_job_transition).
    parent_id = models.UUIDField(null=True, blank=True)
    parent_step = models.TextField(null=True, blank=True)
    # An idempotency window (.using(unique_for=...)): how long after it finishes the job keeps
    # its key in x_job_keys, -1 for "forever"; NULL for a key held while live only.
    unique_for_ms = models.BigIntegerField(null=True, blank=True)
    # ---- a name no worker that claimed it knows (docs/deployment.md, "New job types before
    # their workers"): when its wait began. Set by job_give_back_unknown_if_owned; it means
    # "waiting" only while the last entry of `attempts` is that give-back's (`unknown_job`).
    unknown_since = models.DateTimeField(null=True, blank=True)

    objects = JobManager()

    class Meta:
        db_table = "x_jobs"
        verbose_name = "job"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                F("name"), Coalesce(F("tenant_id"), Value("")), F("idempotency_key"),
                condition=Q(state__in=LIVE_STATES) & DEFAULT_KEY_EXCLUDED,
                name="x_jobs_live_key_uniq",
            ),
            models.CheckConstraint(
                condition=Q(state__in=ALL_STATES), name="x_jobs_state_valid"
            ),
        ]
        indexes = [
            models.Index(
                F("queue"), F("priority").desc(), F("run_at"),
                condition=Q(state__in=("ready", "delayed", "suspended")),
                name="x_jobs_claim_idx",
            ),
            models.Index(
                fields=["queue", "visible_at"], condition=Q(state="running"),
                name="x_jobs_lapsed_idx",
            ),
            # The fair claim's walk over a queue's tenants, and each tenant's jobs in claim
            # order (docs/flow-control.md, "Fair share between tenants"). Its predicate's
            # second half is always true: only a statement that names the tenant expression
            # can use it, so the claim of a queue that is not fair never walks it, where its
            # floors cannot bound the scan (docs/performance.md, "Under a held horizon").
            models.Index(
                F("queue"), Coalesce(F("tenant_id"), Value("")), F("priority").desc(),
                F("run_at"),
                condition=Q(state__in=("ready", "delayed", "suspended")) & Q(IsNull(
                    Coalesce(F("tenant_id"), Value(""), output_field=models.TextField()),
                    False)),
                name="x_jobs_fair_tenant_idx",
            ),
            # Blocked jobs per key in claim order: a freed slot or a resumed key wakes the
            # next ones (docs/flow-control.md).
            models.Index(
                F("blocked_on"), F("priority").desc(), F("run_at"),
                condition=Q(state="blocked"), name="x_jobs_blocked_idx",
            ),
            models.Index(
                fields=["state", "finished_at"], condition=Q(state__in=TERMINAL_STATES),
                name="x_jobs_finished_idx",
            ),
            # publish_event wakes the suspended jobs whose steps wait for it, by run_id.
            models.Index(
                fields=["run_id"], condition=Q(state="suspended"), name="x_jobs_suspended_run_idx",
            ),
            # ---- console ----
            # The console's search by idempotency key (any state: a dead job is what one looks
            # for). Rows without a key are left out, as from the live-key index, so the bulk of
            # unkeyed jobs costs it nothing; a keyed job pays one entry per state change.
            models.Index(
                fields=["idempotency_key"], condition=DEFAULT_KEY_EXCLUDED,
                name="x_jobs_key_idx",
            ),
            # The console's search by run id for the rows the primary key cannot find it in
            # (RUN_ID_APART): none that the API or the outbox writes, so their enqueue, claim
            # and ack pay nothing for it (the condition is checked, no entry written).
            models.Index(fields=["run_id"], condition=RUN_ID_APART, name="x_jobs_run_apart_idx"),
            # A parent's live children: its cancel cancels them (docs/durable.md, "Child jobs").
            models.Index(fields=["parent_id"], condition=Q(parent_id__isnull=False),
                         name="x_jobs_parent_idx"),
            # The jobs list's filters at ten million rows (docs/console.md, "At ten million
            # jobs"). Bloom summaries of name, queue and tenant: a value no job has (a typo, a
            # retired job name, another tenant's name) is ruled out range by range instead of
            # walking the whole primary key for a page that stays empty. Min/max summaries
            # (several intervals per range: a retried job's new run_at does not widen the
            # range to everything) of created_at and run_at: a "created" or "run at" range
            # days back reads only the ranges that hold it; the list orders those pages by that
            # column and reads them window by window
            # (console.paginator.EstimatedCountPaginator).
            # One index for the five columns: one summary per range to keep, not five.
            BrinIndex(
                fields=["name", "queue", "tenant_id", "created_at", "run_at"],
                opclasses=[
                    "text_bloom_ops(n_distinct_per_range = 100)",
                    "text_bloom_ops(n_distinct_per_range = 100)",
                    "text_bloom_ops(n_distinct_per_range = 1000)",
                    "timestamptz_minmax_multi_ops",
                    "timestamptz_minmax_multi_ops",
                ],
                name="x_jobs_console_brin",
            ),
            # ---- cron overlap (docs/scheduling.md, "Overlap") ----
            # The live runs of one cron task (enqueued_by = "cron:<task>"): what a fire of a
            # task with an overlap policy looks at, and what a finished run checks before it
            # lets the run buffered behind it start. Only live rows of cron tasks have an entry,
            # so every other job's enqueue, claim and ack pay nothing for it.
            models.Index(
                fields=["enqueued_by"],
                condition=Q(state__in=LIVE_STATES) & Q(enqueued_by__startswith="cron:"),
                name="x_jobs_cron_live_idx",
            ),
        ]
        permissions = [
            ("cancel_job", "Can cancel jobs"),
            ("retry_job", "Can retry dead or cancelled jobs"),
            ("resume_job", "Can resume dead workflows"),
            ("run_job_now", "Can make delayed or suspended jobs due now"),
            ("purge_job", "Can delete finished jobs"),
            # The health panel shows other database sessions' SQL, literals and all (a password
            # in an ALTER ROLE, a customer's e-mail in a WHERE): not for a view-only support
            # group. Pinned by tests/integration/test_console_security.py.
            ("view_query_text", "Can see the SQL text of other database sessions"),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.state}] {self.id}"


class JobStep(models.Model):
    """Durable step records; (run_id, name) is the key the statements use."""

    id = models.BigAutoField(primary_key=True)
    run_id = models.UUIDField()
    name = models.TextField()
    status = models.TextField()
    output = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    event = models.TextField(null=True, blank=True)
    correlation_key = models.TextField(null=True, blank=True)
    attempts = models.IntegerField(default=1, db_default=1)
    error = models.TextField(null=True, blank=True)
    # The event an event wait consumed (id and publication time). A run's
    # next wait on the same event starts after it, so waits consume events in order.
    event_id = models.BigIntegerField(null=True, blank=True)
    event_published_at = models.DateTimeField(null=True, blank=True)
    # What the step is: run, sleep, event, event_any, invoke (the deploy check compares it).
    # NULL on rows written before it was recorded; the deploy check infers those.
    kind = models.TextField(null=True, blank=True)
    # An invoke step while it waits: how many of its children are still live. The last child
    # to finish brings it to 0 and wakes the parent (docs/durable.md, "Child jobs").
    pending = models.IntegerField(null=True, blank=True)

    class Meta:
        db_table = "x_job_steps"
        verbose_name = "job step"
        constraints = [
            models.UniqueConstraint(fields=["run_id", "name"], name="x_job_steps_run_name_uniq"),
        ]
        indexes = [
            models.Index(
                fields=["event", "correlation_key"], condition=Q(status="waiting"),
                name="x_job_steps_waiting_idx",
            ),
            # The invoke steps whose last child finished: jobs_unblock wakes a suspended parent
            # the child's trigger could not (another transaction held the parent's row).
            models.Index(
                fields=["run_id"], condition=Q(status="invoking", pending__lte=0),
                name="x_job_steps_fanin_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.status}]"


class LeaseExtension(models.Model):
    """A running job's lease, kept beside its row while another transaction holds the row.

    The heartbeat never waits on a row lock: a row it cannot lock now (a request holding it, an
    operator's change not committed yet) has its lease written here instead, keyed by the run's
    lease token, and the claim takes no lapsed lease whose extension still runs. The run goes on,
    and its row is renewed as soon as it is free (docs/design.md, "Lease extensions").
    """

    lease_token = models.UUIDField(primary_key=True)
    job_id = models.UUIDField()
    until = models.DateTimeField()

    class Meta:
        db_table = "x_lease_extensions"
        verbose_name = "lease extension"

    def __str__(self) -> str:
        return f"{self.job_id} until {self.until}"


class JobKey(models.Model):
    """An idempotency window's hold on a key (docs/durable.md, "Idempotency windows").

    One row per (name, tenant, key) ever enqueued with ``unique_for``: the job that holds the
    key, and when it finished (NULL while live). The unique constraint is what decides a race:
    an enqueue takes the key only by an upsert whose condition reads this row's own columns.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.TextField()
    tenant = models.TextField(default="", db_default="")
    key = models.TextField()
    job_id = models.UUIDField()
    # The window the holder was enqueued with; NULL for "forever". Maintenance deletes a row
    # whose window ended.
    unique_for_ms = models.BigIntegerField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "x_job_keys"
        verbose_name = "idempotency window"
        constraints = [
            models.UniqueConstraint(fields=["name", "tenant", "key"], name="x_job_keys_uniq"),
        ]
        indexes = [
            models.Index(fields=["finished_at"], condition=Q(unique_for_ms__isnull=False),
                         name="x_job_keys_expiry_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.key}"


class JobEvent(models.Model):
    id = models.BigAutoField(primary_key=True)  # also the publication order for equal times
    name = models.TextField()
    payload = models.JSONField(null=True, blank=True)
    correlation_key = models.TextField(null=True, blank=True)
    published_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "x_job_events"
        verbose_name = "job event"
        indexes = [
            models.Index(fields=["name", "correlation_key", "published_at"],
                         name="x_job_events_match_idx"),
            models.Index(fields=["name", "published_at", "id"], name="x_job_events_order_idx"),
            models.Index(fields=["expires_at"], name="x_job_events_expiry_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.id}"


class OutboxEntry(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.TextField()
    queue = models.TextField(default="default")
    input = models.JSONField(default=dict)
    idempotency_key = models.TextField(null=True, blank=True)
    max_attempts = models.IntegerField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)
    staged_at = models.DateTimeField(db_default=Now())
    tenant_id = models.TextField(null=True, blank=True)
    traceparent = models.TextField(null=True, blank=True)
    enqueued_by = models.TextField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    # Every enqueue option survives the trip through the outbox.
    priority = models.IntegerField(default=0, db_default=0)
    delay_ms = models.BigIntegerField(default=0, db_default=0)
    concurrency_key = models.TextField(null=True, blank=True)
    job_id = models.UUIDField(null=True, blank=True)  # the job it became
    rate_key = models.TextField(null=True, blank=True)
    # The idempotency window in ms, -1 for "forever" (docs/durable.md, "Idempotency windows").
    unique_for_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "x_outbox"
        verbose_name = "outbox entry"
        verbose_name_plural = "outbox"
        indexes = [
            models.Index(fields=["staged_at"], condition=Q(published_at__isnull=True),
                         name="x_outbox_pending_idx"),
            models.Index(fields=["published_at"], condition=Q(published_at__isnull=False),
                         name="x_outbox_published_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.job} staged {self.staged_at:%Y-%m-%d %H:%M:%S}"


class JobLease(models.Model):
    """Concurrency slots (django_xjobs/slots.py). The model, its table and ``lease_key`` keep
    the schema's names; everywhere else in Python this is a *slot* and ``lease_key`` its
    ``slot_key`` (docs/design.md, "Tables"). ``(lease_key, slot)`` is the key the statements
    use."""

    id = models.BigAutoField(primary_key=True)
    lease_key = models.TextField()
    slot = models.IntegerField()
    holder = models.TextField()
    expires_at = models.DateTimeField()

    objects = SlotManager()

    class Meta:
        db_table = "x_job_leases"
        verbose_name = "concurrency slot"
        constraints = [
            models.UniqueConstraint(
                fields=["lease_key", "slot"], name="x_job_leases_key_slot_uniq"
            ),
        ]
        indexes = [models.Index(fields=["expires_at"], name="x_job_leases_expiry_idx")]

    def __str__(self) -> str:
        return f"{self.lease_key}#{self.slot}"


class SchedulerLeader(models.Model):
    lock_key = models.TextField(primary_key=True)
    holder = models.TextField()
    expires_at = models.DateTimeField()

    objects = LeaderManager()

    class Meta:
        db_table = "x_scheduler_leader"
        verbose_name = "scheduler leader"

    def __str__(self) -> str:
        return f"{self.lock_key}: {self.holder}"


class SchedulerState(models.Model):
    task_name = models.TextField(primary_key=True)
    last_fired_at = models.DateTimeField()
    updated_at = models.DateTimeField(db_default=Now())
    paused = models.BooleanField(default=False, db_default=False)
    # ---- cron overlap (docs/scheduling.md, "Overlap") ----
    # Occurrences the task's overlap policy did not enqueue (skip, buffer_one's drops,
    # cancel_previous's superseded ones), and the latest of them.
    overlap_skipped = models.BigIntegerField(default=0, db_default=0)
    overlap_skipped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "x_scheduler_state"
        verbose_name = "schedule watermark"

    def __str__(self) -> str:
        return self.task_name


class Backfill(models.Model):
    run_id = models.UUIDField(primary_key=True)
    name = models.TextField()
    checksum = models.TextField(null=True, blank=True)
    app_version = models.TextField(null=True, blank=True)
    status = models.TextField(default="running", db_default="running")
    rows_processed = models.BigIntegerField(default=0, db_default=0)
    last_cursor = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    job_id = models.UUIDField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)
    # ---- backfills: every resume under code other than the code the pass last ran with
    # ({"checksum", "app_version", "at", "rows_processed"}), so an audit can tell which rows
    # which code processed (django_xjobs/backfills/provenance.py).
    code_changes = models.JSONField(default=list, db_default=Value([], models.JSONField()))

    class Meta:
        db_table = "x_backfills"
        verbose_name = "backfill"
        indexes = [models.Index(fields=["name", "started_at"], name="x_backfills_name_idx")]

    def __str__(self) -> str:
        return f"{self.name} [{self.status}]"


class FlowPause(models.Model):
    """A pause: of a queue (``kind="queue"``, nothing of it is claimed) or of a key (``kind=
    "key"``, no job whose concurrency or rate-limit key it is), until ``until`` or until
    resumed (docs/flow-control.md, "Pause and circuit breakers")."""

    id = models.BigAutoField(primary_key=True)
    kind = models.TextField(choices=[("queue", "queue"), ("key", "key")])
    key = models.TextField()
    until = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(null=True, blank=True)
    paused_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "x_flow_pauses"
        verbose_name = "pause"
        constraints = [
            models.UniqueConstraint(fields=["kind", "key"], name="x_flow_pauses_kind_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


class RateUnit(models.Model):
    """Units of a rate-limit budget spent (docs/flow-control.md, "Rate limits"): one row per
    grant, kept for one period of its key."""

    id = models.BigAutoField(primary_key=True)
    key = models.TextField()
    at = models.DateTimeField()
    cost = models.IntegerField()

    class Meta:
        db_table = "x_rate_units"
        verbose_name = "rate-limit unit"
        indexes = [models.Index(fields=["key", "at"], name="x_rate_units_key_at_idx")]

    def __str__(self) -> str:
        return f"{self.key} {self.cost} at {self.at}"


class WorkerRow(models.Model):
    """A worker process seen lately: written when it starts and with its heartbeat, deleted
    when it stops (``xjobs why`` names a queue no worker serves)."""

    id = models.TextField(primary_key=True)
    host = models.TextField()
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    started_at = models.DateTimeField(db_default=Now())
    seen_at = models.DateTimeField(db_default=Now())
    # What its heartbeat reports (docs/observability.md, "Workers and health probes"): the
    # package version, how many runs it may hold and holds, how many it finished, when it last
    # claimed a job, and when its loop last went round (a loop wedged while the heartbeat
    # thread runs shows here).
    version = models.TextField(default="", db_default="")
    concurrency = models.IntegerField(default=0, db_default=0)
    running = models.IntegerField(default=0, db_default=0)
    finished = models.BigIntegerField(default=0, db_default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    loop_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "x_workers"
        verbose_name = "worker"

    def __str__(self) -> str:
        return self.id


class Fleet(models.Model):
    """What the processes sharing these tables can read (docs/deployment.md, "Mixed versions"):
    at most one row. ``compatible_with`` names the oldest release series (``"0.1"``) that may
    still run against the tables; while it is set, this version writes nothing that series
    cannot read (``django_xjobs/versions.py`` lists what it holds back). No row, or a NULL, means
    every process runs this version or a newer one. Migration 0012 writes the row when it
    upgrades tables an earlier version used; ``manage.py xjobs fleet --finish-upgrade`` clears
    it once the old processes are gone."""

    id = models.BooleanField(primary_key=True, default=True, db_default=True)
    compatible_with = models.TextField(null=True, blank=True)
    changed_at = models.DateTimeField(db_default=Now())
    changed_by = models.TextField(default="", db_default="")

    class Meta:
        db_table = "x_fleet"
        verbose_name = "fleet"
        constraints = [models.CheckConstraint(condition=Q(id=True), name="x_fleet_one_row")]

    def __str__(self) -> str:
        return f"compatible with {self.compatible_with or 'this version'}"


class BigIntArray(models.Field):
    """A ``bigint[]`` column, read and written as a list of ints by psycopg: the counters'
    histograms and durations, without asking projects to install django.contrib.postgres for
    ArrayField."""

    description = "PostgreSQL bigint[]"

    def db_type(self, connection: object) -> str:
        return "bigint[]"


class Counts(models.Model):
    """What the counters count, per queue and job name (docs/observability.md, "Counters"): the
    columns ``x_stat_deltas`` and ``x_stats`` share (``fragments.COUNTER_COLUMNS`` of the
    statements, and the sums of the waits and run times, in ms)."""

    queue = models.TextField()
    name = models.TextField()
    enqueued = models.BigIntegerField(default=0, db_default=0)
    started = models.BigIntegerField(default=0, db_default=0)
    done = models.BigIntegerField(default=0, db_default=0)
    failed = models.BigIntegerField(default=0, db_default=0)
    dead = models.BigIntegerField(default=0, db_default=0)
    cancelled = models.BigIntegerField(default=0, db_default=0)
    wait_ms_sum = models.BigIntegerField(default=0, db_default=0)
    run_ms_sum = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        abstract = True


class StatDelta(Counts):
    """What one statement changed, per queue and job name: written in the same statement as the
    state change (an insert, so concurrent writers never wait on one counter row), and folded
    into ``x_stats`` by the rollup."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(db_default=Now())
    # The wait (due -> start) of each start and the run time of each finished run, in ms (their
    # sums are written with them, so a read that needs only the sums never unnests them).
    wait_ms = BigIntArray(null=True, blank=True)
    run_ms = BigIntArray(null=True, blank=True)

    class Meta:
        db_table = "x_stat_deltas"
        verbose_name = "counter delta"


class Stat(Counts):
    """Counters per queue, job name and time bucket: ``grain`` is minute, hour or day, or
    ``total`` (``at`` the epoch: since the table began, what Prometheus counters read)."""

    id = models.BigAutoField(primary_key=True)
    grain = models.TextField(choices=[(g, g) for g in ("minute", "hour", "day", "total")])
    at = models.DateTimeField()
    # Counts per bucket of records.HISTOGRAM_BOUNDS_MS (one more than the bounds), not
    # cumulative.
    wait_hist = BigIntArray(null=True, blank=True)
    run_hist = BigIntArray(null=True, blank=True)

    class Meta:
        db_table = "x_stats"
        verbose_name = "counter"
        constraints = [
            models.UniqueConstraint(fields=["grain", "at", "queue", "name"],
                                    name="x_stats_bucket_uniq"),
        ]
