"""The frame of the console's own pages (the dashboard, a queue's page, the health panel): the
admin's context, the title, the auto-refresh (``?refresh=``)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.template.response import TemplateResponse

from ..options import ConsoleAdmin
from ..reads.health import WORKER_MAX_STALL
from ..reads.text import humanize_seconds

REFRESH_CHOICES = (5, 10, 30, 60)


def render(model_admin: ConsoleAdmin, request: Any, template: str, title: str,
           **context: Any) -> HttpResponse:
    """``template`` for ``model_admin``'s site, with the view permission of its model."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    refresh = request.GET.get("refresh")
    request.current_app = model_admin.admin_site.name  # the templates' {% url %}: this site's
    return TemplateResponse(request, template, {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": title,
        "refresh": int(refresh) if refresh in {str(r) for r in REFRESH_CHOICES} else None,
        "refresh_choices": REFRESH_CHOICES,
        "max_stall_text": humanize_seconds(WORKER_MAX_STALL), **context,
    })
