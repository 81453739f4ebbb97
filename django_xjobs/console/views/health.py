"""The health panel (docs/console.md, "The health panel")."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse

from ..options import ConsoleAdmin
from ..reads.health import health
from ..reads.scope import tenant_scope
from .page import render


def health_view(model_admin: ConsoleAdmin, request: Any) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    tenants = tenant_scope(request)
    # Other sessions' SQL carries literals: superusers and holders of view_query_text see
    # it, everyone else its first word (reads.health.redact_query).
    panel = health(tenants, query_text=request.user.has_perm("django_xjobs.view_query_text"))
    return render(model_admin, request, "admin/django_xjobs/health.html", "Queue health",
                  crumb="Health panel", health=panel, now=panel.now, tenants=tenants)
