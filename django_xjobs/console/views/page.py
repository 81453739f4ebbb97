"""The frame of the console's own pages (the dashboard, a queue's page, the health panel): the
admin's context, the title and the breadcrumb. The pages update in place
(docs/console.md, "Live updates"): ``{% xjobs_live %}`` in their template."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.template.response import TemplateResponse

from ..options import ConsoleAdmin
from ..reads.health import WORKER_MAX_STALL
from ..reads.text import humanize_seconds


def render(model_admin: ConsoleAdmin, request: Any, template: str, title: str,
           crumb: str | None = None, **context: Any) -> HttpResponse:
    """``template`` for ``model_admin``'s site, with the view permission of its model; the
    breadcrumbs read Home > the app > ``crumb`` (default: the title)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    request.current_app = model_admin.admin_site.name  # the templates' {% url %}: this site's
    return TemplateResponse(request, template, {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": title, "crumb": crumb or title,
        "max_stall_text": humanize_seconds(WORKER_MAX_STALL), **context,
    })
