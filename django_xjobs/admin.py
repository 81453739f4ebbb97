"""The Django admin as a read-only view of the queue.

The admin reads; it never writes queue state through the ORM. No add/change forms exist for
these models: a person must not be able to put a row in a state no statement would produce.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils.html import format_html

from .models import (
    Backfill,
    Job,
    JobEvent,
    JobLease,
    JobStep,
    OutboxEntry,
    SchedulerLeader,
    SchedulerState,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


def _pretty(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, default=str))


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "queue", "state", "attempt_of", "run_at", "updated_at",
                    "tenant_id", "enqueued_by")
    list_filter = ("state", "queue", "name")
    search_fields = ("=id", "=run_id", "=idempotency_key")
    show_full_result_count = False
    readonly_fields = ("pretty_input", "pretty_result", "error")
    exclude = ("input", "result", "last_error")

    @admin.display(description="attempt")
    def attempt_of(self, obj: Job) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    @admin.display(description="input")
    def pretty_input(self, obj: Job) -> str:
        return _pretty(obj.input)

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> str:
        return _pretty(obj.result)

    @admin.display(description="last error")
    def error(self, obj: Job) -> str:
        return format_html("<pre>{}</pre>", obj.last_error or "")


for model in (JobStep, JobEvent, OutboxEntry, JobLease, SchedulerLeader, SchedulerState,
              Backfill):
    admin.site.register(model, ReadOnlyAdmin)
