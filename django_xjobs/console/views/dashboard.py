"""The dashboard, the console's index, and a queue's page: the live buckets, the last 24 hours,
the pauses in force and the charts of a window of counters (docs/console.md, "The dashboard",
"Charts", "The queue page")."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.utils.safestring import mark_safe

from ... import counters
from ...pauses import pauses
from ...values import NAME_RE
from .. import charts
from ..options import ConsoleAdmin
from ..reads.dashboard import QueueRow, dashboard, queue_chart, queue_rows
from ..reads.scope import TenantScope, tenant_scope
from ..reads.shards import shard_rows, total
from ..reads.text import db_now, shown_time
from .page import render
from .pauses import may_pause


def dashboard_view(model_admin: ConsoleAdmin, request: Any) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    tenants = tenant_scope(request)
    board = dashboard(tenants)
    in_force = pauses()
    queue_pauses = {p.key: p for p in in_force if p.kind == "queue"}
    window = _window(request)
    shards = shard_rows(tenants, getattr(request, "xjobs_shard", None) or "")
    return render(model_admin, request, "admin/django_xjobs/dashboard.html", "Jobs dashboard",
                  crumb="Dashboard", board=board, now=board.now, tenants=tenants,
                  shards=shards, shards_total=total(shards),
                  queue_rows=[(q, queue_pauses.get(q.queue)) for q in board.queues],
                  queue_pauses=list(queue_pauses.values()),
                  # A key names anything (a partner, a tenant): unscoped operators only.
                  key_pauses=[p for p in in_force if p.kind == "key"]
                  if tenants is None else [],
                  can_pause=may_pause(model_admin, request),
                  **_charts(window, tenants, None))


def queue_view(model_admin: ConsoleAdmin, request: Any, queue: str) -> HttpResponse:
    """One queue: its live buckets, its last 24 hours and its three charts."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    if not NAME_RE.match(queue):
        raise Http404(f"{queue!r} is not a queue name")
    tenants = tenant_scope(request)
    rows = {q.queue: q for q in queue_rows(tenants)}
    row = rows.get(queue) or QueueRow(
        queue=queue, failed_24h=None if tenants is not None else 0)
    paused = next((p for p in pauses() if p.kind == "queue" and p.key == queue), None)
    return render(model_admin, request, "admin/django_xjobs/queue.html", f"Queue {queue}",
                  now=db_now(), tenants=tenants, q=row, paused=paused,
                  can_pause=may_pause(model_admin, request),
                  **_charts(_window(request), tenants, queue))


def _window(request: Any) -> str:
    """The charts' window from ``?window=``: hour (the default), day or week; any other
    value says so and shows the hour."""
    asked = request.GET.get("window") or "hour"
    if asked in counters.WINDOWS:
        return str(asked)
    messages.warning(request, f"There is no chart window {asked[:40]!r}: choose hour, day "
                              "or week. Showing the last hour.")
    return "hour"


def _charts(window: str, tenants: TenantScope, queue: str | None) -> dict[str, Any]:
    """The charts of a page (none under a tenant scope: the counters count every
    tenant's jobs) and the window links."""
    found: list[str] = []
    if tenants is None:
        chart = queue_chart(window, queue)
        pattern = "%a %H:%M" if window == "week" else "%H:%M"

        def label(moment: Any) -> str:
            shown = shown_time(moment)
            return shown.strftime(pattern) if shown is not None else "-"

        # charts.py escapes every text it draws: its markup goes into the page as it is.
        found = [mark_safe(svg) for svg in charts.window_charts(
            chart, label=label, queues=[queue] if queue else None)]
    return {"charts": found, "window": window, "windows": list(counters.WINDOWS),
            "window_words": charts.WINDOW_WORDS[window]}
