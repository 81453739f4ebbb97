"""Backfill passes (docs/backfills.md): their progress, rate and last cursor."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import TextField
from django.db.models.functions import Cast, Left

from ..models import Backfill
from .display import badge
from .options import ClockedAdmin
from .reads.tables import backfill_rate

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
        rate = backfill_rate(obj, obj.db_clock)
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
        return self.job_html(obj.job_id)
