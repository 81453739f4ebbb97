"""The jobs list and a job's page (docs/console.md, "Finding the job", "Understanding it").

At ten million jobs (docs/console.md, "At ten million jobs"): the default order is the primary
key (UUIDv7: newest first); a "created" or "run at" range orders the list by that column and is
read window by window (:class:`.paginator.EstimatedCountPaginator`); an id, a run id or a key
is found exactly on an index (:func:`run_id_match`), and a search by what a job is about (a
value in its input, words of its input or error, a name pattern, a worker) is read table by
table on the history tables' indexes (:mod:`.reads.search`, :class:`JobChangeList`). The
operator actions are :mod:`.actions` (over a filter: :mod:`.bulk`); the dashboard, queue,
health and pause pages, which this admin serves, are :mod:`.views`.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast
from django.http import HttpResponse, HttpResponseRedirect
from django.urls import path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from rangefilter.filters import DateTimeRangeFilterBuilder

from .. import conf, shards, why
from ..exceptions import JobNotFound
from ..models import Job, JobStep
from ..records import attempt_history, progress_from_json
from .actions import ACTIONS, guarded_action, vet_action_post
from .display import badge, preformatted, short_time
from .filters import (
    ErrorFilter,
    NameFilter,
    QueueFilter,
    StateFilter,
    TenantFilter,
    WorkerFilter,
)
from .options import ConsoleAdmin
from .paginator import EXACT_COUNT_LIMIT, WINDOWED
from .reads import search
from .reads.jobs import diagnose, run_children, run_steps
from .reads.json_columns import shown_json
from .reads.scope import tenant_scope
from .reads.search import run_id_match
from .reads.text import (
    ago,
    as_uuid,
    clock_text,
    db_now,
    duration_text,
    error_summary,
    seconds_between,
)
from .views import dashboard, health, pauses


class JobChangeList(ChangeList):
    """The jobs list; narrowed by a search (words, a value in the input, a pattern of names, a
    worker, an error), it is read table by table (:func:`.reads.search.newest_per_table`), as
    far as the count and the page shown need."""

    def get_queryset(self, request: Any, exclude_parameters: Any = None) -> Any:
        queryset = super().get_queryset(request, exclude_parameters)
        # An action's POST gets the whole filter (the selected rows are taken from it, or all
        # of it for an action over the filter).
        acting = request.method == "POST" and "action" in request.POST
        if search.searched(request) and exclude_parameters is None and not acting:
            request._xjobs_matches = search.count_per_table(queryset, cap=EXACT_COUNT_LIMIT + 1)
            queryset = search.newest_per_table(
                queryset, limit=self.page_num * self.list_per_page + 1)
        return queryset


@admin.register(Job)
class JobAdmin(ConsoleAdmin):
    tenant_field = "tenant_id"
    # Fits 1280 px beside the filters (tests/acceptance/test_console_browser.py); who enqueued
    # a job is on its page.
    list_display = ("id_link", "state_badge", "name_wrapped", "queue", "attempt_of", "run_at_short",
                    "updated_at_short", "tenant_id", "error_line")
    list_display_links = None
    list_filter = (
        StateFilter, QueueFilter, NameFilter, TenantFilter, WorkerFilter, ErrorFilter,
        ("created_at", DateTimeRangeFilterBuilder(title="created")),
        ("run_at", DateTimeRangeFilterBuilder(title="run at")),
    )
    search_fields = ("=id",)  # shows the box; get_search_results does the matching
    search_help_text = ("A job id, run id or idempotency key; a value in the input "
                        "(order_id=42, customer.email=a@b.example); or words of the input or "
                        "the last error (card declined).")
    ordering = ("-id",)
    actions = [guarded_action(spec) for spec in ACTIONS.values()]
    fieldsets = (
        (None, {"fields": ("state_badge", "name", "queue", "attempt_of", "priority",
                           "tenant_id", "enqueued_by")}),
        ("Timing", {"fields": ("created", "due", "waited", "started", "ran_for", "finished",
                               "updated", "lease")}),
        ("Run", {"fields": ("claimed_by", "workers", "rescues", "id", "run_id",
                            "idempotency_key", "concurrency_key", "traceparent",
                            "lease_token", "parent_link", "children_links")}),
        ("Input", {"fields": ("pretty_input",)}),
        ("Result", {"fields": ("pretty_result",)}),
        ("Last error", {"fields": ("error",)}),
    )
    readonly_fields = ("state_badge", "attempt_of", "created", "due", "waited", "started",
                       "ran_for", "finished", "updated", "lease", "workers", "pretty_input",
                       "pretty_result", "error", "parent_link", "children_links")

    def get_changelist(self, request: Any, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_paginator(self, request: Any, queryset: Any, per_page: int, orphans: int = 0,
                      allow_empty_first_page: bool = True) -> Any:
        paginator = super().get_paginator(request, queryset, per_page, orphans,
                                          allow_empty_first_page)
        matches = getattr(request, "_xjobs_matches", None)
        if matches is not None:  # a search, counted table by table (JobChangeList)
            paginator.counted_already(matches)
        return paginator

    def get_object(self, request: Any, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:  # children_links lists only the children the viewer may see
            obj._xjobs_tenants = tenant_scope(request)
        return obj

    # ------------------------------------------------------------ parent and children --
    # docs/durable.md, "Child jobs": a child links to its parent, a parent lists its children.
    @admin.display(description="parent")
    def parent_link(self, obj: Job) -> str:
        if obj.parent_id is None:
            return self.get_empty_value_display()
        return format_html('<a href="{}{}/change/" class="xjobs-parent">{}</a> (step {})',
                           self.url("django_xjobs_job_changelist"), obj.parent_id,
                           obj.parent_id, obj.parent_step)

    @admin.display(description="children")
    def children_links(self, obj: Job) -> str:
        # The viewer's tenant scope, set by get_object; none set shows no child (fails closed).
        children = run_children(obj.run_id,
                                      tenants=getattr(obj, "_xjobs_tenants", frozenset()))
        if not children.total:
            return self.get_empty_value_display()
        url = self.url("django_xjobs_job_changelist")
        items = format_html_join(
            "", '<li><a href="{}{}/change/" class="xjobs-child">{}</a> {} {} (step {})</li>',
            ((url, child.pk, child.pk, child.name, badge(child.state), step)
             for step, child in children.shown))
        more = (format_html("<li>… {} more</li>", children.total - len(children.shown))
                if children.total > len(children.shown) else "")
        return format_html('<ul class="xjobs-children">{}{}</ul>', items, more)

    # -------------------------------------------------------------------------- columns --
    @admin.display(description="job")
    def id_link(self, obj: Job) -> str:
        # The id's head: UUIDv7s of one period share it, so the tail tells rows apart; the whole
        # id is the link's title and on the detail page.
        text = str(obj.pk)
        return format_html('<a href="{}{}/change/" class="xjobs-id" title="{}">{}…{}</a>',
                           self.url("django_xjobs_job_changelist"), text, text,
                           text[:8], text[-6:])

    @admin.display(description="name")
    def name_wrapped(self, obj: Job) -> str:
        """The job's name, free to wrap after a dot or an underscore (never inside a word):
        ``shop.orders.charge_card`` takes two short lines in a narrow column."""
        parts = re.split(r"(?<=[._])", obj.name)
        return format_html_join(mark_safe("<wbr>"), "{}", ((p,) for p in parts))

    @admin.display(description="last error")
    def error_line(self, obj: Job) -> str:
        """The line of the last error a person reads first (the exception and its message),
        cut to the column; the whole line is its title."""
        line = error_summary(obj.last_error)
        if not line:
            return ""
        # The exception's class without its module (django_xjobs.exceptions.PermanentError:
        # ... reads PermanentError: ...): the column is narrow, the title has it all.
        shown = re.sub(r"^(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*:)", r"\1", line)
        return format_html('<span class="xjobs-error-line" title="{}">{}</span>', line, shown)

    @admin.display(description="run at")
    def run_at_short(self, obj: Job) -> str:
        return short_time(obj.run_at)

    @admin.display(description="updated")
    def updated_at_short(self, obj: Job) -> str:
        return short_time(obj.updated_at)

    @admin.display(description="state")
    def state_badge(self, obj: Job) -> str:
        return badge(obj.state)

    @admin.display(description="attempt")
    def attempt_of(self, obj: Job) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    # ------------------------------------------------------------------ timing (detail) --
    # To the second, in the page's time zone, each with how long ago it was on the database
    # clock; and the durations an operator computes by hand otherwise. Pinned by
    # tests/integration/test_console_time.py.
    @staticmethod
    def _now(obj: Job) -> Any:
        if not hasattr(obj, "_xjobs_now"):
            obj._xjobs_now = db_now()  # type: ignore[attr-defined]
        return obj._xjobs_now  # type: ignore[attr-defined]

    def _moment(self, obj: Job, moment: Any) -> str:
        if moment is None:
            return "-"
        return f"{clock_text(moment)} ({ago(moment, self._now(obj))})"

    @admin.display(description="created")
    def created(self, obj: Job) -> str:
        return self._moment(obj, obj.created_at)

    @admin.display(description="run at (due)")
    def due(self, obj: Job) -> str:
        return self._moment(obj, obj.run_at)

    @admin.display(description="queued for")
    def waited(self, obj: Job) -> str:
        now = self._now(obj)
        if obj.state == "ready" and obj.run_at <= now:
            return (f"{duration_text(seconds_between(obj.run_at, now))} so "
                    "far: due, no worker has taken it yet")
        if obj.started_at is not None and obj.started_at >= obj.run_at and obj.state in (
                "running", "done", "dead", "cancelled"):
            seconds = seconds_between(obj.run_at, obj.started_at)
            return (f"{duration_text(seconds)}: from due to the start of attempt "
                    f"{obj.attempt}")
        return "-"

    @admin.display(description="started (last attempt)")
    def started(self, obj: Job) -> str:
        return self._moment(obj, obj.started_at)

    @admin.display(description="ran for")
    def ran_for(self, obj: Job) -> str:
        if obj.started_at is None:
            return "-"
        if obj.state == "running":
            seconds = seconds_between(obj.started_at, self._now(obj))
            return f"{duration_text(seconds)} so far (attempt {obj.attempt})"
        if obj.finished_at is not None and obj.finished_at >= obj.started_at:
            seconds = seconds_between(obj.started_at, obj.finished_at)
            return f"{duration_text(seconds)} (attempt {obj.attempt})"
        return "-"

    @admin.display(description="finished")
    def finished(self, obj: Job) -> str:
        return self._moment(obj, obj.finished_at)

    @admin.display(description="updated")
    def updated(self, obj: Job) -> str:
        return self._moment(obj, obj.updated_at)

    @admin.display(description="lease until (visible_at)")
    def lease(self, obj: Job) -> str:
        if obj.visible_at is None:
            return "-"
        text = clock_text(obj.visible_at)
        if obj.state != "running":
            return text
        left = seconds_between(self._now(obj), obj.visible_at)
        if left > 0:
            return f"{text} (expires in {duration_text(left)})"
        return f"{text} (expired {duration_text(-left)} ago)"

    @admin.display(description="workers that ran it")
    def workers(self, obj: Job) -> str:
        shown = shown_json(obj, "worker_ids")
        if shown.decoded and not shown.truncated and isinstance(shown.value, list):
            return ", ".join(str(w) for w in shown.value) or "-"
        return shown.text or "-"

    @admin.display(description="input")
    def pretty_input(self, obj: Job) -> str:
        return self.json_html(obj, "input")

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> str:
        return self.json_html(obj, "result")

    @admin.display(description="last error")
    def error(self, obj: Job) -> str:
        return preformatted(obj.last_error)

    # -------------------------------------------------------------------------- ordering --
    def get_ordering(self, request: Any) -> Any:
        """Newest first by the column of a "created" or "run at" range when one is given (the
        paginator then reads the range window by window: EstimatedCountPaginator), else by id.
        By id, a range days back would walk the primary key past every newer row first."""
        for field in WINDOWED:
            if any(k.startswith(f"{field}__range__") and v for k, v in request.GET.items()):
                return (f"-{field}", "-id")
        return self.ordering

    # --------------------------------------------------------------------------- search --
    def get_search_results(self, request: Any, queryset: Any, search_term: str) -> Any:
        """Each on an index: a uuid is the id (primary key), else a run id (see
        :func:`run_id_match`) or an idempotency key; any other term is the idempotency key
        (``x_jobs_key_idx``, over keyed rows), a value at a path of the input
        (``order_id=42``) or words of the input's values or of the last error
        (:func:`.reads.search.text_search`)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        uid = as_uuid(term)
        if uid is None:
            search.mark_searched(request)
            return queryset.filter(search.text_search(term)), False
        # A job id first: one primary-key probe, and a uuid names one row.
        if queryset.filter(id=uid).exists():
            return queryset.filter(id=uid), False
        # The same condition as the partial key index's, so the planner can use it.
        by_key = Q(idempotency_key=term) & ~Q(idempotency_key=Cast(F("id"), TextField()))
        return queryset.filter(by_key | run_id_match(uid)), False

    # ------------------------------------------------------------------------- pages --
    # The console's own pages (views/), served by this admin: its site, its permissions.
    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("dashboard/", view(self.dashboard_view), name="django_xjobs_dashboard"),
            path("health/", view(self.health_view), name="django_xjobs_health"),
            path("queue/<str:queue>/", view(self.queue_view), name="django_xjobs_queue"),
            path("pause/", view(self.pause_view), name="django_xjobs_pause"),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: Any) -> HttpResponse:
        return dashboard.dashboard_view(self, request)

    def queue_view(self, request: Any, queue: str) -> HttpResponse:
        return dashboard.queue_view(self, request, queue)

    def health_view(self, request: Any) -> HttpResponse:
        return health.health_view(self, request)

    def pause_view(self, request: Any) -> HttpResponse:
        return pauses.pause_view(self, request)

    def _on_another_shard(self, request: Any, object_id: str) -> HttpResponse | None:
        """A job's page opened on the wrong shard (a link from an alert or a log line, which
        names no shard): a redirect choosing the shard that holds it, else None."""
        if not conf.get().shards or self.get_object(request, unquote(object_id)) is not None:
            return None
        try:
            found = shards.locate(unquote(object_id))
        except (ValueError, DatabaseError):
            return None  # not a job id, or a shard unreachable: the page says "no such job"
        if found is None or found == getattr(request, "xjobs_shard", None):
            return None
        return HttpResponseRedirect(f"{request.path}?shard={found}")

    def change_view(self, request: Any, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        elsewhere = self._on_another_shard(request, object_id)
        if elsewhere is not None:
            return elsewhere
        job = self._object_or_404(request, object_id)
        steps = run_steps(job.run_id)
        now = db_now()
        # Step outputs are step records: on the job's page too they need the steps' own view
        # permission (a "support" group given view_job alone does not see them).
        step_admin = self.admin_site.get_model_admin(JobStep)
        can_view_steps = step_admin.has_view_permission(request)
        step_outputs = [step_admin.json_html(s, "output") if can_view_steps else ""
                        for s in steps]
        buttons = [
            (spec, spec.name) for spec in ACTIONS.values()
            if spec.applies(job) and spec.name in self.get_actions(request)
            and (spec.name != "run_jobs_now" or job.state != "ready" or job.run_at > now)
        ]
        try:
            blocked_by = why.for_job(job.pk)
        except JobNotFound:  # deleted since it was read: the page shows it as read
            blocked_by = ()
        progress = progress_from_json(job.progress)
        eta = progress.eta(job.started_at) if progress and job.state == "running" else None
        context = {
            "attempt_rows": self._attempt_rows(job), "progress": progress,
            "progress_eta": f"{clock_text(eta)} ({ago(eta, now)})" if eta else None,
            "diagnosis": diagnose(job, steps, now, reasons=blocked_by), "steps": steps,
            "db_now": now,
            "blocked_by": blocked_by,
            "step_rows": list(zip(steps, step_outputs, strict=True)),
            "can_view_steps": can_view_steps,
            "action_buttons": buttons, "changelist_url":
                self.url("django_xjobs_job_changelist"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME, **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    @staticmethod
    def _attempt_rows(job: Job) -> list[dict[str, Any]]:
        """The attempt history (``Job.attempts``), oldest first, as the job page shows it: the
        times in the page's zone, the duration, the line of the error a person reads first (the
        exception and its message, the last line of a traceback) and the whole error."""
        rows = []
        for a in attempt_history(job.attempts, state=job.state, attempt=job.attempt,
                                 worker=job.claimed_by, started_at=job.started_at,
                                 finished_at=job.finished_at):
            error = (a.error or "").strip()
            rows.append({"run": a.run, "attempt": a.attempt, "outcome": a.outcome,
                         "worker": a.worker,
                         "started": clock_text(a.started_at),
                         "finished": clock_text(a.finished_at),
                         "duration": duration_text(a.duration),
                         "error_line": error_summary(error) or "",
                         "error": error})
        return rows

    # -------------------------------------------------------------------------- actions --
    def has_cancel_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.cancel_job")

    def has_retry_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.retry_job")

    def has_resume_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.resume_job")

    def has_run_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.run_job_now")

    def has_purge_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.purge_job")

    def changelist_view(self, request: Any, extra_context: dict[str, Any] | None = None) -> Any:
        request.current_app = self.admin_site.name  # the confirmation pages' {% url %}
        vet_action_post(self, request)
        context = {"dashboard_url": self.url("django_xjobs_dashboard"),
                   "health_url": self.url("django_xjobs_health"),
                   # The list's count can be a floor or an estimate: the action over the
                   # filter counts them before it is confirmed (actions.run_over_filter).
                   "selection_note_all": "Select every job that matches the filter (counted "
                                         "before you confirm)",
                   **(extra_context or {})}
        return super().changelist_view(request, context)
