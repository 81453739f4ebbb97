"""Views a project mounts in its own ``urls.py``.

``metrics``: the Prometheus exposition of django-xjobs' figures (docs/observability.md,
"Metrics: Prometheus and OpenTelemetry"). It asks for no login, like most ``/metrics``
endpoints: mount it where only Prometheus reaches it, or wrap it, e.g.
``path("metrics", staff_member_required(views.metrics))``.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import metrics as xjobs_metrics


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """One scrape: a registry of django-xjobs' collector alone (a project's own metrics stay in
    its own registry), in the format the scraper asked for (Accept: the Prometheus text format,
    or OpenMetrics)."""
    registry = xjobs_metrics.registry()
    # Optional (django-xjobs[prometheus]); registry() said which extra when it is missing.
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)
