"""The scheduler's leader lease and its tasks' watermarks (docs/scheduling.md)."""

from __future__ import annotations

from django.contrib import admin

from ..models import SchedulerLeader, SchedulerState
from .options import ClockedAdmin, ConsoleAdmin


@admin.register(SchedulerLeader)
class SchedulerLeaderAdmin(ClockedAdmin):
    hidden_under_scope = True
    list_display = ("lock_key", "holder", "expires_at", "live")
    ordering = ("lock_key",)

    @admin.display(description="leading now", boolean=True)
    def live(self, obj: SchedulerLeader) -> bool:
        return self.unexpired(obj)


@admin.register(SchedulerState)
class SchedulerStateAdmin(ConsoleAdmin):
    hidden_under_scope = True
    list_display = ("task_name", "last_fired_at", "paused", "updated_at")
    ordering = ("task_name",)
