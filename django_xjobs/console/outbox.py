"""The outbox of ``enqueue_on_commit`` (docs/transactional-enqueue.md): what is staged, what was
relayed, and the job each entry became."""

from __future__ import annotations

from django.contrib import admin

from ..models import OutboxEntry
from .filters import OutboxPendingFilter
from .options import ConsoleAdmin


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
        return self.job_html(obj.job_id)

    @admin.display(description="input")
    def pretty_input(self, obj: OutboxEntry) -> str:
        return self.json_html(obj, "input")
