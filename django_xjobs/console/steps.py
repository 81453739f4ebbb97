"""The durable steps and the published events (docs/durable.md): read-only lists, searched by
an exact run id or correlation key."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.utils.html import format_html

from ..models import JobEvent, JobStep
from .display import badge, preformatted
from .filters import EventNameFilter, StepStatusFilter
from .options import ConsoleAdmin
from .reads.scope import TenantScope, steps_scoped
from .reads.text import as_uuid, error_summary


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

    def scope_queryset(self, queryset: Any, tenants: TenantScope) -> Any:
        return steps_scoped(queryset, tenants)

    def get_search_results(self, request: Any, queryset: Any, search_term: str) -> Any:
        term = search_term.strip()
        if not term:
            return queryset, False
        uid = as_uuid(term)
        # x_job_steps_run_name_uniq leads with run_id: an exact run id is an index lookup.
        return (queryset.filter(run_id=uid) if uid else queryset.none()), False

    @admin.display(description="status")
    def status_badge(self, obj: JobStep) -> str:
        return badge(obj.status)

    @admin.display(description="error")
    def error_line(self, obj: JobStep) -> str:
        return error_summary(obj.error, 80) or ""

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
