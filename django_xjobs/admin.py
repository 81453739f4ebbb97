"""The operations console: the Django admin as a read-only view of the queue, plus actions.

The admin reads; it never writes queue state through the ORM (docs/console.md). No add or change
forms exist: a person must not be able to put a row in a state no statement would produce.
The four operator actions (cancel, retry now, run now, delete finished) call :mod:`api`, which
runs the engine's fenced statements, the same ones ``manage.py xjobs`` uses. Each action has its
own permission (``Job.Meta.permissions``), a confirmation page, a result message with counts,
and an entry in Django's admin log naming the user.

Pages: the dashboard and the health panel (:mod:`reads` computes both, for the CLI too), a page
per queue with its charts (:mod:`charts`), the jobs list and detail, and read-only lists of
steps, events, outbox, concurrency slots, backfills and the scheduler's leader and watermarks.
The same classes serve the project's admin and the console's own site at ``/_x/``
(:mod:`console`): every URL is reversed on the site that serves the page.

Scale (docs/console.md, "At ten million jobs"): no exact ``count(*)`` on a big table — the
paginator counts exactly up to :data:`EXACT_COUNT_LIMIT` rows and estimates beyond (the
planner's row estimate, from ``pg_class.reltuples``); the default order is the primary key
(UUIDv7: newest first); columns are not sortable (a sort of a million rows is not a page view);
filter choices come from the settings and the registry, never from ``select distinct``; a
"created" or "run at" range orders the list by that column and is read window by window
(:class:`EstimatedCountPaginator`); search is exact and on indexes only.

Tenant scope: ``XJOBS["ADMIN_TENANT_SCOPE"]`` (:func:`reads.tenant_scope`) restricts every
queryset here and every action's statement (``tenant_ids=``); another tenant's job is a 404,
and the pages of tables without a tenant column are not shown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast, Left, Now
from django.db.models.lookups import (
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
)
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe
from rangefilter.filters import DateTimeRangeFilterBuilder

from . import api, charts, conf, counters, reads, registry, why
from .api import acting_as
from .exceptions import ConfigurationError, JobNotFound, LiveJobExists, XJobsError
from .models import (
    RUN_ID_APART,
    Backfill,
    FlowPause,
    Job,
    JobEvent,
    JobLease,
    JobStep,
    OutboxEntry,
    SchedulerLeader,
    SchedulerState,
)
from .pauses import (
    MAX_REASON,
    check_target,
    describe,
    parse_length,
    pause,
    pauses,
    resume_key,
    resume_queue,
)
from .records import (
    ALL_STATES,
    LIVE_STATES,
    TERMINAL_STATES,
    attempt_history,
    progress_from_json,
)
from .values import NAME_RE

# Counted exactly up to this many rows, estimated beyond; and no page past MAX_PAGES (an OFFSET
# of a hundred thousand rows is already slow; narrow the list with a filter instead).
EXACT_COUNT_LIMIT = 1000
MAX_PAGES = 1000
# One action touches at most this many jobs (one statement each); "select all" of a million
# matching rows is done in rounds, and the result message says so.
ACTION_LIMIT = 1000
REFRESH_CHOICES = (5, 10, 30, 60)


# ------------------------------------------------------------------------------- pagination --


def _planner_rows(queryset: Any) -> int:
    """The planner's estimate of the rows ``queryset`` matches (from ``pg_class.reltuples`` and
    the column statistics): EXPLAIN plans the query and runs nothing."""
    try:
        plan = queryset.order_by().explain(format="json")
        return int(json.loads(plan)[0]["Plan"]["Plan Rows"])
    except (ValueError, KeyError, IndexError, TypeError):
        return 0


class EstimatedCountPaginator(Paginator):
    """Exact counts for small results, the planner's estimate for big ones: never a full
    ``count(*)`` of a big table, which reads every row on every page view
    (docs/performance.md, "What the simpler forms cost"). ``estimated`` tells the template to
    say "about".

    A list ordered newest first by a column of :data:`WINDOWED` (the jobs list with a "created"
    or "run at" range: ``JobAdmin.get_ordering``) is counted and paged window by window: the
    rows since ``start - span``, the span growing until the window holds the page (or more
    rows than are counted exactly) or covers the range. The rows of a window precede every row
    outside it in that order, so its page is the whole range's page, and a window that holds
    more than the limit tells that the range does; but a window reads only the table pages the
    BRIN summary of ``x_jobs_console_brin`` places in it. The whole range (a day of history is
    a seventh of the table at ten million jobs) would be sorted to show fifty rows, and its
    count, a scan that stops at the limit, would read the table from its start up to the
    range's first row."""

    estimated = False

    @cached_property
    def counted(self) -> dict[int, int]:
        """Rows of every other window (k -> rows, up to EXACT_COUNT_LIMIT + 1), until one holds
        more than the limit, or up to the whole list (k = WINDOW_ROUNDS)."""
        counted = {}
        for k, part in self._windows(every=2):
            # Unordered: any EXACT_COUNT_LIMIT + 1 rows tell "more than the limit" as well as
            # the first ones in the list's order would, without sorting every match first.
            counted[k] = part.order_by()[: EXACT_COUNT_LIMIT + 1].count()
            if counted[k] > EXACT_COUNT_LIMIT:
                break
        return counted

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        bounded = self.counted[max(self.counted)]
        if bounded <= EXACT_COUNT_LIMIT:
            return bounded  # of the whole list: only a window holding more ends the counting
        self.estimated = True
        return max(bounded, _planner_rows(self.object_list))

    @cached_property
    def num_pages(self) -> int:  # type: ignore[override]
        if self.count == 0 and not self.allow_empty_first_page:
            return 0
        hits = max(1, self.count - self.orphans)
        return min(MAX_PAGES, math.ceil(hits / self.per_page))

    def page(self, number: Any) -> Any:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        counted = self.counted
        for k, part in self._windows(every=1):
            # The rows of the smallest window counted that contains this one (None: past them).
            rows_in = next((counted[j] for j in sorted(counted) if j >= k), None)
            if rows_in is not None and rows_in <= EXACT_COUNT_LIMIT and (
                    rows_in < top or k not in counted):
                continue  # too few rows for the page, or a window counted holds it: read that
            rows = list(part[bottom:top])
            if len(rows) >= top - bottom:
                break
        return self._get_page(rows, number, self)

    def _windows(self, every: int) -> Iterator[tuple[int, Any]]:
        """``(k, the list narrowed to window k)`` for every ``every``-th window (none unless the
        list is ordered by a column of WINDOWED), then ``(WINDOW_ROUNDS, the whole list)``."""
        field = _windowed_order(self.object_list)
        if field is not None:
            # Windows end at the range's end or now, whichever is earlier (a range ending later
            # today holds nothing after now but delayed jobs, and those are in every window).
            highest = _bound(self.object_list, field, (LessThan, LessThanOrEqual), min)
            start = min(highest, timezone.now()) if highest is not None else timezone.now()
            lowest = _bound(self.object_list, field, (GreaterThan, GreaterThanOrEqual), max)
            for k in range(0, WINDOW_ROUNDS, every):
                since = start - WINDOW_FIRST * WINDOW_GROWTH ** k
                if lowest is not None and since <= lowest:
                    break  # the window holds the whole range: the whole list is the same
                yield k, self.object_list.filter(**{f"{field}__gte": since})
        yield WINDOW_ROUNDS, self.object_list


# The columns a list may be read window by window in (see EstimatedCountPaginator): each is in
# x_jobs_console_brin. Window k spans WINDOW_FIRST * WINDOW_GROWTH ** k: a minute, then 4 times
# longer each, up to about two years (1 min, 4 min, 16 min, 1.1 h, 4.3 h, 17 h, 2.8 d, ...,
# 2 y), then the whole range. The count reads every other one (16 times longer each); a page
# reads the window counted that holds it, or, when that one holds more than the count's limit
# (a quiet hour before a busy one), the window between first: a quarter of it.
WINDOWED = ("created_at", "run_at")
WINDOW_FIRST = timedelta(minutes=1)
WINDOW_GROWTH = 4
WINDOW_ROUNDS = 11


def _windowed_order(queryset: Any) -> str | None:
    """The column of :data:`WINDOWED` a queryset is ordered by, newest first, or None."""
    order = getattr(getattr(queryset, "query", None), "order_by", ())
    first = order[0] if order and isinstance(order[0], str) else ""
    return first[1:] if first.startswith("-") and first[1:] in WINDOWED else None


def _bound(queryset: Any, field: str, lookups: tuple[type, ...],
           pick: Callable[[list[datetime]], datetime]) -> datetime | None:
    """The tightest bound on ``field`` of the given comparisons among the conditions every row
    of ``queryset`` meets (its top-level AND), or None."""
    where = queryset.query.where
    if where.connector != "AND" or where.negated:
        return None
    bounds = []
    for child in where.children:
        rhs: Any = getattr(child, "rhs", None)
        target = getattr(getattr(child, "lhs", None), "target", None)
        if isinstance(child, lookups) and isinstance(rhs, datetime) \
                and getattr(target, "name", None) == field:
            bounds.append(rhs)
    return pick(bounds) if bounds else None


# ---------------------------------------------------------------------------------- filters --


class ChoiceOrTextFilter(admin.SimpleListFilter):
    """Choices the code knows (settings, registry) plus a text box for any other value: the
    choices never come from ``select distinct`` over a million rows."""

    template = "admin/django_xjobs/choice_or_text_filter.html"
    field_name = ""

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return ()

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in sorted(set(self.known(request, model_admin)))]

    def has_output(self) -> bool:
        return True  # the text box is useful even with no known choices

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value:
            return queryset.filter(**{self.field_name: value})
        return queryset

    def choices(self, changelist: Any) -> Any:
        self.keep = [(k, v) for k, v in changelist.params.items()
                     if k != self.parameter_name]
        yield from super().choices(changelist)


class QueueFilter(ChoiceOrTextFilter):
    title = "queue"
    parameter_name = field_name = "queue"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return [*conf.get().queues, *(j.queue for j in registry.all_jobs().values())]


class NameFilter(ChoiceOrTextFilter):
    title = "job name"
    parameter_name = field_name = "name"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return registry.all_jobs().keys()


class TenantFilter(ChoiceOrTextFilter):
    title = "tenant"
    parameter_name = "tenant"
    field_name = "tenant_id"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return reads.tenant_scope(request) or ()


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"
    LAPSED = "lapsed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in ALL_STATES] + [(self.LAPSED, "running, lease expired")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value == self.LAPSED:
            return queryset.filter(state="running", visible_at__lte=Now())
        if value in ALL_STATES:
            return queryset.filter(state=value)
        return queryset


class StepStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in ("completed", "failed", "sleeping", "waiting", "cancelled")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(status=self.value()) if self.value() else queryset


class EventNameFilter(ChoiceOrTextFilter):
    title = "event name"
    parameter_name = field_name = "name"


class OutboxPendingFilter(admin.SimpleListFilter):
    title = "relayed"
    parameter_name = "pending"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "pending (not relayed yet)"), ("no", "published")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() == "yes":
            return queryset.filter(published_at=None)
        if self.value() == "no":
            return queryset.exclude(published_at=None)
        return queryset


# ----------------------------------------------------------------------------------- bases --


def badge(value: str) -> str:
    return format_html('<span class="xjobs-badge xjobs-{}">{}</span>', value, value)


def json_block(shown: reads.ShownJson, whole_url: str) -> str:
    """A JSON column on a page: indented (or, when Python cannot decode it, as stored), at most
    :data:`reads.JSON_PAGE_CHARS` characters of it, and a link to the whole value beyond."""
    if shown.text is None:
        return "-"
    notes = []
    if not shown.decoded:
        notes.append(format_html(
            "This value could not be decoded by Python's json module ({}): it is shown as "
            "the database stores it.", shown.problem))
    if shown.truncated:
        notes.append(format_html(
            'Shortened to its first {} of {} characters: <a href="{}">the whole value</a>.',
            f"{reads.JSON_PAGE_CHARS:,}", f"{shown.chars:,}", whole_url))
    elif not shown.decoded:
        notes.append(format_html('<a href="{}">The value as stored</a>.', whole_url))
    note = format_html('<p class="xjobs-note">{}</p>', format_html_join(" ", "{}", (
        (n,) for n in notes))) if notes else ""
    return format_html('<pre class="xjobs-json">{}</pre>{}', shown.text, note)


def preformatted(text: str | None) -> str:
    return format_html('<pre class="xjobs-error">{}</pre>', text) if text else "-"


def short_time(moment: Any) -> str:
    """``2026-12-02 18:58:44`` in the page's time zone: a list column that fits on one line."""
    shown = reads.shown_time(moment)
    if shown is None:
        return "-"
    return format_html('<span class="xjobs-time">{}</span>', shown.strftime("%Y-%m-%d %H:%M:%S"))


def _nul_in(params: Any) -> bool:
    return any("\x00" in key or any("\x00" in v for v in params.getlist(key))
               for key in params)


def _as_uuid(value: Any) -> UUID | None:
    try:
        return UUID(str(value).strip())
    except ValueError:
        return None


class ConsoleAdmin(admin.ModelAdmin):
    """Read-only, count-free, sort-free, tenant-aware. Subclasses say how a row is in scope."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    sortable_by: Sequence[str] = ()
    list_per_page = 50
    tenant_field: str | None = None  # rows carry a tenant in this field
    hidden_under_scope = False  # no tenant column: not shown under ADMIN_TENANT_SCOPE

    class Media:
        css = {"all": ("django_xjobs/console.css",)}

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        if self.hidden_under_scope and reads.tenant_scope(request) is not None:
            return False
        return super().has_view_permission(request, obj)

    def has_module_permission(self, request: Any) -> bool:
        if self.hidden_under_scope and reads.tenant_scope(request) is not None:
            return False
        return super().has_module_permission(request)

    def scope_queryset(self, queryset: Any, tenants: reads.TenantScope) -> Any:
        if tenants is None:
            return queryset
        if self.tenant_field is None:
            return queryset.none()
        return reads.scoped(queryset, tenants, self.tenant_field)

    def get_queryset(self, request: Any) -> Any:
        # No page's list shows a JSON column: leave them out (see reads.JSON_FIELDS); a page
        # that shows one reads it as text (get_object).
        queryset = reads.without_json(
            self.scope_queryset(super().get_queryset(request), reads.tenant_scope(request)))
        if _nul_in(request.GET):
            # PostgreSQL refuses NUL in text, so a filter or search value with one would be a
            # database error; no stored value contains one, so nothing matches (the list says
            # why: changelist_view). tests/integration/test_console_rows.py pins every list.
            return queryset.none()
        return queryset

    def changelist_view(self, request: Any, extra_context: dict[str, Any] | None = None) -> Any:
        if _nul_in(request.GET):
            self.message_user(request, "A filter or search value contains a NUL character, "
                              "which no stored value can contain: nothing matches.",
                              messages.ERROR)
        return super().changelist_view(request, extra_context)

    def get_object(self, request: Any, object_id: str, from_field: str | None = None) -> Any:
        return self._find(request, object_id, reads.JSON_PAGE_CHARS)

    def _find(self, request: Any, object_id: str, limit: int | None) -> Any:
        """The row of a page, in scope, its JSON columns read as text (at most ``limit``
        characters of each: see reads.with_json_text), or None."""
        if "\x00" in str(object_id):
            return None  # no key contains NUL, and PostgreSQL refuses one in a text key
        pk = self.model._meta.pk
        try:
            value = pk.to_python(object_id)
        except (ValidationError, ValueError):
            return None
        return reads.with_json_text(self.get_queryset(request), limit).filter(
            **{pk.name: value}).first()

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path("<path:object_id>/json/<str:field>/",
                 self.admin_site.admin_view(self.json_view), name="{}_{}_json".format(*info)),
            *super().get_urls(),
        ]

    def json_view(self, request: Any, object_id: str, field: str) -> HttpResponse:
        """The whole of one JSON column of one row, as the database stores it (pages show at
        most reads.JSON_PAGE_CHARS characters and link here). Nothing is decoded: jsonb's
        text is JSON even when Python's json module cannot load it. Same permission and
        tenant scope as the row's page."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if field not in reads.json_fields(self.model):
            raise Http404(f"{self._meta_name()} has no JSON column {field!r}")
        obj = self._find(request, unquote(object_id), None)
        if obj is None:
            raise Http404(f"no {self._meta_name()} {object_id!r}")
        response = HttpResponse(reads.json_text(obj, field) or "null",
                                content_type="application/json; charset=utf-8")
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def url(self, name: str, *args: Any) -> str:
        """The URL of page ``name`` of the site this admin belongs to: the project's admin or
        the console at ``/_x/`` (docs/console.md), which register the same classes."""
        return reverse(f"{self.admin_site.name}:{name}", args=args)

    def whole_json_url(self, obj: Any, field: str) -> str:
        info = self.opts.app_label, self.opts.model_name
        return self.url("{}_{}_json".format(*info), obj.pk, field)

    def json_html(self, obj: Any, field: str) -> str:
        return json_block(reads.shown_json(obj, field), self.whole_json_url(obj, field))

    def _object_or_404(self, request: Any, object_id: str) -> Any:
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            # A foreign tenant's row and a row that does not exist look the same: 404.
            raise Http404(f"no {self._meta_name()} {object_id!r}")
        return obj

    def _meta_name(self) -> str:
        return str(self.model._meta.verbose_name)

    def change_view(self, request: Any, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        self._object_or_404(request, object_id)
        return super().change_view(request, object_id, form_url, extra_context)

    def history_view(self, request: Any, object_id: str,
                     extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        self._object_or_404(request, object_id)
        return super().history_view(request, object_id, extra_context)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        declared = list(super().get_readonly_fields(request, obj))
        hidden = set(self.exclude or ())  # shown by a declared display method instead
        return declared + [f.name for f in self.model._meta.concrete_fields
                           if f.name not in declared and f.name not in hidden]


# -------------------------------------------------------------------------------- actions --


class CancelForm(forms.Form):
    reason = forms.CharField(
        required=False, max_length=1500, widget=forms.TextInput(attrs={"size": 60}),
        help_text="Recorded in the job's last_error, with your username.",
    )


# How the console writes a pause's end (its messages and the admin log).
PAUSE_TIME = "%Y-%m-%d %H:%M:%S %Z"


class PauseForm(forms.Form):
    """The optional end and reason of a pause from the console (docs/console.md, "Pauses")."""

    duration = forms.CharField(
        required=False, max_length=40, widget=forms.TextInput(attrs={"size": 12}),
        help_text="How long, e.g. 30m, 2h, 1d. Empty: until someone resumes it.",
    )
    reason = forms.CharField(
        required=False, max_length=MAX_REASON - 200,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Shown with the pause, with your username.",
    )

    def clean_duration(self) -> float | None:
        text = self.cleaned_data["duration"].strip()
        if not text:
            return None
        try:
            return parse_length(text, what="duration")
        except ConfigurationError as exc:
            raise ValidationError(str(exc)) from None


@dataclass(frozen=True)
class ActionSpec:
    """One operator action: its permission, which states it applies to, and the words."""

    name: str
    permission: str  # codename in Job.Meta.permissions
    verb: str  # "cancel" -> "Cancelled 3 jobs"
    done_word: str
    applies: Callable[[Job], bool]
    explain: str


ACTIONS: dict[str, ActionSpec] = {spec.name: spec for spec in (
    ActionSpec("cancel_jobs", "cancel_job", "cancel", "cancelled",
               lambda j: j.state in LIVE_STATES,
               "A live job (ready, delayed, running, suspended) becomes cancelled and is never "
               "run again. A running one stops at its worker's next heartbeat; its late result "
               "is discarded."),
    ActionSpec("retry_jobs", "retry_job", "retry", "retried",
               lambda j: j.state in ("dead", "cancelled"),
               "A dead or cancelled job gets a fresh set of attempts and is due now; its "
               "completed steps are kept. A job whose idempotency key another live job holds "
               "is skipped."),
    ActionSpec("run_jobs_now", "run_job_now", "run now", "made due now",
               lambda j: j.state in ("delayed", "suspended") or j.state == "ready",
               "A delayed or suspended job (or a ready one due later) becomes due at once; a "
               "suspended one's open sleep or event wait ends (the wait returns None)."),
    ActionSpec("delete_finished_jobs", "purge_job", "delete", "deleted",
               lambda j: j.state in TERMINAL_STATES,
               "Finished jobs (done, dead, cancelled) and their steps are deleted for good. "
               "Live jobs are left alone: cancel them first."),
)}


def _guarded_action(spec: ActionSpec) -> Any:
    def action(modeladmin: JobAdmin, request: HttpRequest, queryset: Any) -> Any:
        return modeladmin.run_action(spec, request, queryset)

    action.__name__ = spec.name
    # Django asks JobAdmin.has_<short>_permission(request) before it offers the action.
    short = {"cancel_job": "cancel", "retry_job": "retry", "run_job_now": "run",
             "purge_job": "purge"}[spec.permission]
    descriptions = {"cancel_jobs": "Cancel selected jobs…",
                    "retry_jobs": "Retry selected jobs now…",
                    "run_jobs_now": "Run selected jobs now…",
                    "delete_finished_jobs": "Delete selected finished jobs…"}
    return admin.action(description=descriptions[spec.name], permissions=[short])(action)


# ------------------------------------------------------------------------------------- jobs --


@admin.register(Job)
class JobAdmin(ConsoleAdmin):
    tenant_field = "tenant_id"
    list_display = ("id_link", "state_badge", "name", "queue", "attempt_of", "run_at_short",
                    "updated_at_short", "tenant_id", "enqueued_by")
    list_display_links = None
    list_filter = (
        StateFilter, QueueFilter, NameFilter, TenantFilter,
        ("created_at", DateTimeRangeFilterBuilder(title="created")),
        ("run_at", DateTimeRangeFilterBuilder(title="run at")),
    )
    search_fields = ("=id",)  # shows the box; get_search_results does the matching
    search_help_text = "An exact job id, run id or idempotency key."
    ordering = ("-id",)
    actions = [_guarded_action(spec) for spec in ACTIONS.values()]
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

    def get_object(self, request: Any, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:  # children_links lists only the children the viewer may see
            obj._xjobs_tenants = reads.tenant_scope(request)
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
        children = reads.run_children(obj.run_id,
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
            obj._xjobs_now = reads.db_now()  # type: ignore[attr-defined]
        return obj._xjobs_now  # type: ignore[attr-defined]

    def _moment(self, obj: Job, moment: Any) -> str:
        if moment is None:
            return "-"
        return f"{reads.clock_text(moment)} ({reads.ago(moment, self._now(obj))})"

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
            return (f"{reads.duration_text(reads.seconds_between(obj.run_at, now))} so "
                    "far: due, no worker has taken it yet")
        if obj.started_at is not None and obj.started_at >= obj.run_at and obj.state in (
                "running", "done", "dead", "cancelled"):
            seconds = reads.seconds_between(obj.run_at, obj.started_at)
            return (f"{reads.duration_text(seconds)}: from due to the start of attempt "
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
            seconds = reads.seconds_between(obj.started_at, self._now(obj))
            return f"{reads.duration_text(seconds)} so far (attempt {obj.attempt})"
        if obj.finished_at is not None and obj.finished_at >= obj.started_at:
            seconds = reads.seconds_between(obj.started_at, obj.finished_at)
            return f"{reads.duration_text(seconds)} (attempt {obj.attempt})"
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
        text = reads.clock_text(obj.visible_at)
        if obj.state != "running":
            return text
        left = reads.seconds_between(self._now(obj), obj.visible_at)
        if left > 0:
            return f"{text} (expires in {reads.duration_text(left)})"
        return f"{text} (expired {reads.duration_text(-left)} ago)"

    @admin.display(description="workers that ran it")
    def workers(self, obj: Job) -> str:
        shown = reads.shown_json(obj, "worker_ids")
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
        """Exact matches only, each on an index: the id (primary key), the idempotency key
        (``x_jobs_key_idx``, over keyed rows: an unkeyed job's key is its id, found by the id),
        the run id (see :func:`run_id_match`)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        # The same condition as the partial index's, so the planner can use it.
        by_key = Q(idempotency_key=term) & ~Q(idempotency_key=Cast(F("id"), TextField()))
        uid = _as_uuid(term)
        if uid is None:
            return queryset.filter(by_key), False
        # A job id first: one primary-key probe, and a uuid names one row.
        if queryset.filter(id=uid).exists():
            return queryset.filter(id=uid), False
        return queryset.filter(by_key | run_id_match(uid)), False

    # ------------------------------------------------------------------------- pages --
    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("dashboard/", view(self.dashboard_view), name="django_xjobs_dashboard"),
            path("health/", view(self.health_view), name="django_xjobs_health"),
            path("queue/<str:queue>/", view(self.queue_view), name="django_xjobs_queue"),
            path("pause/", view(self.pause_view), name="django_xjobs_pause"),
            *super().get_urls(),
        ]

    def _page(self, request: Any, template: str, title: str, **context: Any) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        refresh = request.GET.get("refresh")
        request.current_app = self.admin_site.name  # the templates' {% url %}: this site's
        return TemplateResponse(request, template, {
            **self.admin_site.each_context(request), "opts": self.model._meta, "title": title,
            "refresh": int(refresh) if refresh in {str(r) for r in REFRESH_CHOICES} else None,
            "refresh_choices": REFRESH_CHOICES,
            "max_stall_text": reads.humanize_seconds(reads.WORKER_MAX_STALL), **context,
        })

    def dashboard_view(self, request: Any) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        tenants = reads.tenant_scope(request)
        board = reads.dashboard(tenants)
        in_force = pauses()
        queue_pauses = {p.key: p for p in in_force if p.kind == "queue"}
        window = self._window(request)
        return self._page(request, "admin/django_xjobs/dashboard.html", "Jobs dashboard",
                          board=board, now=board.now, tenants=tenants,
                          queue_rows=[(q, queue_pauses.get(q.queue)) for q in board.queues],
                          queue_pauses=list(queue_pauses.values()),
                          # A key names anything (a partner, a tenant): unscoped operators only.
                          key_pauses=[p for p in in_force if p.kind == "key"]
                          if tenants is None else [],
                          can_pause=self.has_pause_permission(request),
                          **self._charts(window, tenants, None))

    def queue_view(self, request: Any, queue: str) -> HttpResponse:
        """One queue: its live buckets, its last 24 hours and its three charts."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if not NAME_RE.match(queue):
            raise Http404(f"{queue!r} is not a queue name")
        tenants = reads.tenant_scope(request)
        rows = {q.queue: q for q in reads.queue_rows(tenants)}
        row = rows.get(queue) or reads.QueueRow(
            queue=queue, failed_24h=None if tenants is not None else 0)
        paused = next((p for p in pauses() if p.kind == "queue" and p.key == queue), None)
        return self._page(request, "admin/django_xjobs/queue.html", f"Queue {queue}",
                          now=reads.db_now(), tenants=tenants, q=row, paused=paused,
                          can_pause=self.has_pause_permission(request),
                          **self._charts(self._window(request), tenants, queue))

    @staticmethod
    def _window(request: Any) -> str:
        """The charts' window from ``?window=``: hour (the default), day or week; any other
        value says so and shows the hour."""
        asked = request.GET.get("window") or "hour"
        if asked in counters.WINDOWS:
            return str(asked)
        messages.warning(request, f"There is no chart window {asked[:40]!r}: choose hour, day "
                                  "or week. Showing the last hour.")
        return "hour"

    @staticmethod
    def _charts(window: str, tenants: reads.TenantScope, queue: str | None) -> dict[str, Any]:
        """The charts of a page (none under a tenant scope: the counters count every
        tenant's jobs) and the window links."""
        found: list[str] = []
        if tenants is None:
            chart = reads.queue_chart(window, queue)
            pattern = "%a %H:%M" if window == "week" else "%H:%M"

            def label(moment: Any) -> str:
                shown = reads.shown_time(moment)
                return shown.strftime(pattern) if shown is not None else "-"

            # charts.py escapes every text it draws: its markup goes into the page as it is.
            found = [mark_safe(svg) for svg in charts.window_charts(
                chart, label=label, queues=[queue] if queue else None)]
        return {"charts": found, "window": window, "windows": list(counters.WINDOWS),
                "window_words": charts.WINDOW_WORDS[window]}

    def health_view(self, request: Any) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        tenants = reads.tenant_scope(request)
        # Other sessions' SQL carries literals: superusers and holders of view_query_text see
        # it, everyone else its first word (reads.redact_query).
        health = reads.health(tenants, query_text=request.user.has_perm(
            "django_xjobs.view_query_text"))
        return self._page(request, "admin/django_xjobs/health.html", "Queue health",
                          health=health, now=health.now, tenants=tenants)

    def change_view(self, request: Any, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        job = self._object_or_404(request, object_id)
        steps = reads.run_steps(job.run_id)
        now = reads.db_now()
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
            "progress_eta": f"{reads.clock_text(eta)} ({reads.ago(eta, now)})" if eta else None,
            "diagnosis": reads.diagnose(job, steps, now), "steps": steps, "db_now": now,
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
            rows.append({"attempt": a.attempt, "outcome": a.outcome, "worker": a.worker,
                         "started": reads.clock_text(a.started_at),
                         "finished": reads.clock_text(a.finished_at),
                         "duration": reads.duration_text(a.duration),
                         "error_line": reads.error_summary(error) or "",
                         "error": error})
        return rows

    # --------------------------------------------------------------------------- pauses --
    def has_pause_permission(self, request: Any) -> bool:
        """Pausing and resuming queues and keys: the change permission of pauses, for an
        unscoped operator only (a pause holds back every tenant's jobs)."""
        return (self.has_view_permission(request) and reads.tenant_scope(request) is None
                and request.user.has_perm("django_xjobs.change_flowpause"))

    def pause_view(self, request: Any) -> HttpResponse:
        """POST only. ``op=resume`` resumes at once; ``op=pause`` shows a form for the
        optional duration and reason, and pauses once it is posted back with ``post=yes``."""
        if not self.has_pause_permission(request):
            raise PermissionDenied
        request.current_app = self.admin_site.name
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        op, kind, name = (request.POST.get(f) for f in ("op", "kind", "name"))
        if op not in ("pause", "resume") or kind not in ("queue", "key") or not name:
            messages.error(request, "Unknown pause action.")
            return HttpResponseRedirect(self.url("django_xjobs_dashboard"))
        try:
            check_target(kind, name)  # before any query names it (no NUL reaches the ORM)
            if op == "resume":
                return self._resume(request, kind, name)
            form = PauseForm(request.POST if "post" in request.POST else None)
            if "post" not in request.POST or not form.is_valid():
                return TemplateResponse(request, "admin/django_xjobs/pause_confirm.html", {
                    **self.admin_site.each_context(request), "opts": self.model._meta,
                    "title": f"Pause {kind} {name}", "crumb": "Pause", "form": form,
                    "kind": kind, "name": name,
                })
            seconds = form.cleaned_data["duration"]
            reason = form.cleaned_data["reason"] or None
            who = f"admin:{request.user.get_username()}"
            record = pause(
                kind, name, for_=timedelta(seconds=seconds) if seconds else None,
                reason=f"{reason} ({who})" if reason else who)
        except XJobsError as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(self.url("django_xjobs_dashboard"))
        said = describe(record, when=PAUSE_TIME)
        self._log_pause(request, record.kind, record.key, f"paused {said}")
        messages.success(request, f"Paused {kind} {name} {said}.")
        return HttpResponseRedirect(self.url("django_xjobs_dashboard"))

    def _resume(self, request: Any, kind: str, name: str) -> HttpResponse:
        self._log_pause(request, kind, name, "resumed")
        if kind == "queue":
            was = resume_queue(name)
            text = f"Resumed queue {name}." if was else f"Queue {name} was not paused."
        else:
            was, handed_back = resume_key(name)
            text = (f"Resumed key {name}" if was else f"Key {name} was not paused") + (
                f"; {handed_back} blocked job{'s' if handed_back != 1 else ''} handed back.")
        messages.success(request, text)
        return HttpResponseRedirect(self.url("django_xjobs_dashboard"))

    @staticmethod
    def _log_pause(request: Any, kind: str, name: str, message: str) -> None:
        """An entry in Django's admin log naming the user, like the job actions'."""
        rows = FlowPause.objects.filter(kind=kind, key=name)
        if rows.exists():
            LogEntry.objects.log_actions(user_id=request.user.pk, queryset=rows,
                                         action_flag=CHANGE, change_message=message)

    # -------------------------------------------------------------------------- actions --
    def has_cancel_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.cancel_job")

    def has_retry_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.retry_job")

    def has_run_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.run_job_now")

    def has_purge_permission(self, request: Any) -> bool:
        return request.user.has_perm("django_xjobs.purge_job")

    def changelist_view(self, request: Any, extra_context: dict[str, Any] | None = None) -> Any:
        request.current_app = self.admin_site.name  # the confirmation pages' {% url %}
        if request.method == "POST" and "action" in request.POST:
            names = request.POST.getlist("action")
            try:
                name = names[int(request.POST.get("index", 0))]
            except (ValueError, IndexError):
                name = None
            if name in ACTIONS and name not in self.get_actions(request):
                raise PermissionDenied(f"you may not {ACTIONS[name].verb} jobs")
            # A malformed id in the selection must not become a database error: drop it.
            post = request.POST.copy()
            post.setlist(helpers.ACTION_CHECKBOX_NAME, [
                v for v in post.getlist(helpers.ACTION_CHECKBOX_NAME) if _as_uuid(v)])
            request.POST = post
        context = {"dashboard_url": self.url("django_xjobs_dashboard"),
                   "health_url": self.url("django_xjobs_health"), **(extra_context or {})}
        return super().changelist_view(request, context)

    def run_action(self, spec: ActionSpec, request: Any, queryset: Any) -> Any:
        if spec.name not in self.get_actions(request):  # belt and braces: see changelist_view
            raise PermissionDenied
        chosen = list(queryset.order_by("-id")[: ACTION_LIMIT + 1])
        truncated = len(chosen) > ACTION_LIMIT
        chosen = chosen[:ACTION_LIMIT]
        form = CancelForm(request.POST if "post" in request.POST else None)
        if "post" not in request.POST or (spec.name == "cancel_jobs" and not form.is_valid()):
            return self._confirm(request, spec, chosen, truncated, form)
        return self._apply(request, spec, chosen, truncated, form)

    def _confirm(self, request: Any, spec: ActionSpec, chosen: list[Job], truncated: bool,
                 form: CancelForm) -> HttpResponse:
        applies = [j for j in chosen if spec.applies(j)]
        context = {
            **self.admin_site.each_context(request), "opts": self.model._meta,
            "title": f"{spec.verb.capitalize()} jobs: are you sure?", "spec": spec,
            "crumb": spec.verb.capitalize(),
            "applies": applies, "skipped": [j for j in chosen if not spec.applies(j)],
            "chosen": chosen, "truncated": truncated, "limit": ACTION_LIMIT,
            "form": form if spec.name == "cancel_jobs" else None,
            "select_across": request.POST.get("select_across") == "1",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "next": self._next_url(request),
        }
        return TemplateResponse(request, "admin/django_xjobs/action_confirm.html", context)

    @staticmethod
    def _next_url(request: Any) -> str | None:
        url = request.POST.get("_next")
        if url and url_has_allowed_host_and_scheme(url, {request.get_host()},
                                                   request.is_secure()):
            return str(url)
        return None

    def _apply(self, request: Any, spec: ActionSpec, chosen: list[Job], truncated: bool,
               form: CancelForm) -> Any:
        tenants = reads.tenant_scope(request)
        who = f"admin:{request.user.get_username()}"
        changed: list[Job] = []
        skipped: dict[str, int] = {}
        live_holders: list[str] = []

        def skip(reason: str) -> None:
            skipped[reason] = skipped.get(reason, 0) + 1

        with acting_as(who):
            if spec.name == "delete_finished_jobs":
                finished = [j for j in chosen if spec.applies(j)]
                for j in chosen:
                    if not spec.applies(j):
                        skip(f"{j.state} (only finished jobs are deleted)")
                api.delete_finished([j.id for j in finished], tenant_ids=tenants)
                remaining = set(Job.objects.filter(id__in=[j.id for j in finished])
                                .values_list("id", flat=True))
                changed = [j for j in finished if j.id not in remaining]
                for _ in range(len(finished) - len(changed)):
                    skip("changed meanwhile (retried or locked)")
            else:
                reason = (form.cleaned_data.get("reason") or "").strip() if (
                    spec.name == "cancel_jobs" and form.is_valid()) else ""
                for j in chosen:
                    if spec.name == "cancel_jobs" and not spec.applies(j):
                        skip(f"already {j.state}")
                        continue
                    try:
                        if spec.name == "cancel_jobs":
                            result = api.cancel(
                                j.id, reason=f"{reason} ({who})" if reason else f"by {who}",
                                tenant_ids=tenants)
                        elif spec.name == "retry_jobs":
                            result = api.retry(j.id, tenant_ids=tenants)
                        else:
                            result = api.run_now(j.id, tenant_ids=tenants)
                    except LiveJobExists as exc:
                        skip("a live job holds its idempotency key")
                        if exc.live_job_id:
                            live_holders.append(exc.live_job_id)
                        continue
                    except JobNotFound:
                        skip("gone")
                        continue
                    except XJobsError as exc:
                        skip(str(exc))
                        continue
                    if result.changed:
                        changed.append(j)
                    else:
                        skip(result.reason or "unchanged")
        if changed:
            message = {"cancel_jobs": f"Cancelled by {who}" + (f": {reason}" if spec.name ==
                                                                 "cancel_jobs" and reason
                                                                 else ""),
                       "retry_jobs": f"Retried now by {who}",
                       "run_jobs_now": f"Made due now by {who}",
                       "delete_finished_jobs": f"Deleted by {who}"}[spec.name]
            LogEntry.objects.log_actions(
                user_id=request.user.pk, queryset=changed,
                action_flag=DELETION if spec.name == "delete_finished_jobs" else CHANGE,
                change_message=message,
            )
        self._report(request, spec, changed, skipped, live_holders, truncated)
        nxt = self._next_url(request)
        if nxt and not (spec.name == "delete_finished_jobs" and changed):
            return HttpResponseRedirect(nxt)
        return None

    def _report(self, request: Any, spec: ActionSpec, changed: list[Job],
                skipped: dict[str, int], live_holders: list[str], truncated: bool) -> None:
        n = len(changed)
        level = messages.SUCCESS if n else messages.WARNING
        text = f"{spec.done_word.capitalize()} {n} job{'s' if n != 1 else ''}."
        if skipped:
            parts = ", ".join(why if len(skipped) == 1 else f"{why} ({count})"
                              for why, count in sorted(skipped.items()))
            text += f" Skipped {sum(skipped.values())}: {parts}."
        if truncated:
            text += (f" Only the first {ACTION_LIMIT} of the selection were handled: run the "
                     "action again for the rest.")
        if live_holders:
            links = format_html_join(
                ", ", '<a href="{}">{}</a>',
                ((self.url("django_xjobs_job_change", i), i)
                 for i in live_holders[:5]))
            self.message_user(request, format_html("{} Live job(s) holding the key: {}.", text,
                                                   links), level)
        else:
            self.message_user(request, text, level)


def run_id_match(run_id: UUID) -> Q:
    """A run-id condition that every row meets through an index, never a table scan.

    ``x_jobs.run_id`` has no index over all rows (each index on x_jobs costs every claim and ack
    a write). But the API mints a job's id and run id in one ``new_ids`` call, so both UUIDv7s
    carry the same millisecond: such a job is in the primary-key range of its run id's
    millisecond. Every other row (written by hand, with random uuids) is in
    ``x_jobs_run_apart_idx``, whose condition is that the two differ; the API's rows never
    enter it. ``tests/integration/test_console_admin.py`` pins both paths, and
    ``tests/integration/test_console_plans.py`` the plan of a run id nothing has.
    """
    ms = run_id.int >> 80
    low, high = UUID(int=ms << 80), UUID(int=((ms + 1) << 80) - 1)
    return Q(run_id=run_id, id__gte=low, id__lte=high) | (Q(run_id=run_id) & RUN_ID_APART)


# -------------------------------------------------------------------------- the other pages --


def _job_search_link(model_admin: ConsoleAdmin, run_id: Any) -> str:
    url = model_admin.url("django_xjobs_job_changelist")
    return format_html('<a href="{}?q={}">{}</a>', url, run_id, run_id)


@admin.register(JobStep)
class JobStepAdmin(ConsoleAdmin):
    list_display = ("name", "status_badge", "attempts", "started_at", "completed_at", "wake_at",
                    "event", "error_line", "run")
    list_filter = (StepStatusFilter,)
    search_fields = ("=run_id",)
    search_help_text = "An exact run id (the job's run_id)."
    ordering = ("-id",)
    readonly_fields = ("run", "status_badge", "pretty_output", "error_text")
    exclude = ("output", "error")

    def scope_queryset(self, queryset: Any, tenants: reads.TenantScope) -> Any:
        return reads.steps_scoped(queryset, tenants)

    def get_search_results(self, request: Any, queryset: Any, search_term: str) -> Any:
        term = search_term.strip()
        if not term:
            return queryset, False
        uid = _as_uuid(term)
        # x_job_steps_run_name_uniq leads with run_id: an exact run id is an index lookup.
        return (queryset.filter(run_id=uid) if uid else queryset.none()), False

    @admin.display(description="status")
    def status_badge(self, obj: JobStep) -> str:
        return badge(obj.status)

    @admin.display(description="error")
    def error_line(self, obj: JobStep) -> str:
        return reads.error_summary(obj.error, 80) or ""

    @admin.display(description="job (run id)")
    def run(self, obj: JobStep) -> str:
        return _job_search_link(self, obj.run_id)

    @admin.display(description="output")
    def pretty_output(self, obj: JobStep) -> str:
        return self.json_html(obj, "output")

    @admin.display(description="error")
    def error_text(self, obj: JobStep) -> str:
        return preformatted(obj.error)


@admin.register(JobEvent)
class JobEventAdmin(ConsoleAdmin):
    hidden_under_scope = True  # events carry no tenant
    list_display = ("id", "name", "correlation_key", "published_at", "expires_at")
    list_filter = (EventNameFilter,)
    search_fields = ("=correlation_key",)
    search_help_text = "An exact correlation key (with an event name filter, an index lookup)."
    ordering = ("-id",)
    readonly_fields = ("pretty_payload",)
    exclude = ("payload",)

    def get_search_results(self, request: Any, queryset: Any, search_term: str) -> Any:
        term = search_term.strip()
        return (queryset.filter(correlation_key=term) if term else queryset), False

    @admin.display(description="payload")
    def pretty_payload(self, obj: JobEvent) -> str:
        return self.json_html(obj, "payload")


@admin.register(OutboxEntry)
class OutboxEntryAdmin(ConsoleAdmin):
    tenant_field = "tenant_id"
    list_display = ("staged_at", "job", "queue", "relayed", "published_at", "job_link",
                    "tenant_id", "enqueued_by")
    list_filter = (OutboxPendingFilter,)
    ordering = ("-staged_at",)
    readonly_fields = ("relayed", "job_link", "pretty_input")
    exclude = ("input",)

    @admin.display(description="relayed", boolean=True)
    def relayed(self, obj: OutboxEntry) -> bool:
        return obj.published_at is not None

    @admin.display(description="became job")
    def job_link(self, obj: OutboxEntry) -> str:
        if obj.job_id is None:
            return "-"
        url = self.url("django_xjobs_job_change", obj.job_id)
        return format_html('<a href="{}">{}</a>', url, obj.job_id)

    @admin.display(description="input")
    def pretty_input(self, obj: OutboxEntry) -> str:
        return self.json_html(obj, "input")


class ClockedAdmin(ConsoleAdmin):
    """Rows carry the database clock (``db_clock``), so "expired?" costs no query per row."""

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).annotate(db_clock=Now())


@admin.register(JobLease)
class JobLeaseAdmin(ClockedAdmin):
    hidden_under_scope = True  # slot keys name tenants ("tenant:acme")
    list_display = ("lease_key", "slot", "limit", "holder", "expires_at", "live")
    readonly_fields = ("limit",)
    search_fields = ("=lease_key",)
    ordering = ("lease_key", "slot")

    def get_changelist_instance(self, request: Any) -> Any:
        changelist = super().get_changelist_instance(request)
        # One read for the page's rows (reads.slot_limits), kept on the rows themselves.
        rows = list(changelist.result_list)
        limits = reads.slot_limits((r.lease_key, r.holder) for r in rows)
        for r in rows:
            r.xjobs_limit = limits[(r.lease_key, r.holder)]
        return changelist

    @admin.display(description="limit")
    def limit(self, obj: JobLease) -> str:
        if not hasattr(obj, "xjobs_limit"):
            obj.xjobs_limit = reads.slot_limits([(obj.lease_key, obj.holder)])[
                (obj.lease_key, obj.holder)]
        return "-" if obj.xjobs_limit is None else str(obj.xjobs_limit)

    @admin.display(description="held", boolean=True)
    def live(self, obj: JobLease) -> bool:
        return bool(obj.expires_at > obj.db_clock)


@admin.register(SchedulerLeader)
class SchedulerLeaderAdmin(ClockedAdmin):
    hidden_under_scope = True
    list_display = ("lock_key", "holder", "expires_at", "live")
    ordering = ("lock_key",)

    @admin.display(description="leading now", boolean=True)
    def live(self, obj: SchedulerLeader) -> bool:
        return bool(obj.expires_at > obj.db_clock)


@admin.register(SchedulerState)
class SchedulerStateAdmin(ConsoleAdmin):
    hidden_under_scope = True
    list_display = ("task_name", "last_fired_at", "paused", "updated_at")
    ordering = ("task_name",)


CURSOR_CHARS = 60  # of a backfill's last cursor in the list


@admin.register(Backfill)
class BackfillAdmin(ClockedAdmin):
    hidden_under_scope = True  # a backfill spans tenants
    list_display = ("name", "status_badge", "rows_processed", "rate", "started_at",
                    "completed_at", "cursor", "job_link")
    search_fields = ("=name",)
    ordering = ("-started_at",)
    readonly_fields = ("status_badge", "rate", "job_link", "pretty_cursor", "pretty_changes")
    exclude = ("last_cursor", "code_changes")

    def get_queryset(self, request: Any) -> Any:
        # The list's cursor column: the stored text's head, never decoded (see cursor()).
        return super().get_queryset(request).annotate(
            cursor_head=Left(Cast("last_cursor", TextField()), CURSOR_CHARS + 1))

    @admin.display(description="status")
    def status_badge(self, obj: Backfill) -> str:
        return badge(obj.status)

    @admin.display(description="rows/s")
    def rate(self, obj: Backfill) -> str:
        rate = reads.backfill_rate(obj, obj.db_clock)
        return f"{rate:,.1f}" if rate is not None else "-"

    @admin.display(description="last cursor")
    def cursor(self, obj: Backfill) -> str:
        text = obj.cursor_head
        if text is None:
            return "-"
        return text if len(text) <= CURSOR_CHARS else text[: CURSOR_CHARS - 3] + "..."

    @admin.display(description="last cursor")
    def pretty_cursor(self, obj: Backfill) -> str:
        return self.json_html(obj, "last_cursor")

    @admin.display(description="code changes")
    def pretty_changes(self, obj: Backfill) -> str:
        return self.json_html(obj, "code_changes")

    @admin.display(description="job")
    def job_link(self, obj: Backfill) -> str:
        if obj.job_id is None:
            return "-"
        url = self.url("django_xjobs_job_change", obj.job_id)
        return format_html('<a href="{}">{}</a>', url, obj.job_id)

