"""The concurrency slots held now (docs/concurrency.md), each with the limit it was taken
under."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from ..models import JobLease
from .options import ClockedAdmin
from .reads.tables import slot_limits


@admin.register(JobLease)
class JobLeaseAdmin(ClockedAdmin):
    hidden_under_scope = True  # slot keys name tenants ("tenant:acme")
    list_display = ("lease_key", "slot", "limit", "holder", "expires_at", "live")
    readonly_fields = ("limit",)
    search_fields = ("=lease_key",)
    ordering = ("lease_key", "slot")

    def get_changelist_instance(self, request: Any) -> Any:
        changelist = super().get_changelist_instance(request)
        # One read for the page's rows (slot_limits), kept on the rows themselves.
        rows = list(changelist.result_list)
        limits = slot_limits((r.lease_key, r.holder) for r in rows)
        for r in rows:
            r.xjobs_limit = limits[(r.lease_key, r.holder)]
        return changelist

    @admin.display(description="limit")
    def limit(self, obj: JobLease) -> str:
        if not hasattr(obj, "xjobs_limit"):
            obj.xjobs_limit = slot_limits([(obj.lease_key, obj.holder)])[
                (obj.lease_key, obj.holder)]
        return "-" if obj.xjobs_limit is None else str(obj.xjobs_limit)

    @admin.display(description="held", boolean=True)
    def live(self, obj: JobLease) -> bool:
        return self.unexpired(obj)
