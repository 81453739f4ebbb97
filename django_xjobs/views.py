"""Views a project mounts in its own ``urls.py``.

``metrics``: the Prometheus exposition of django-xjobs' figures (docs/observability.md,
"Metrics: Prometheus and OpenTelemetry"). It asks for no login, like most ``/metrics``
endpoints: mount it where only Prometheus reaches it, or wrap it, e.g.
``path("metrics", staff_member_required(views.metrics))``.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import conf
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

    # With the jobs sharded by tenant, one shard per scrape: ?shard=<alias>, one scrape target
    # per shard (docs/scaling.md, "Sharding by tenant"); the home shard without it.
    shard = request.GET.get("shard")
    if shard is not None and shard not in conf.get().job_databases:
        return HttpResponseBadRequest(
            f"no shard {shard!r}: the shards are {', '.join(conf.get().job_databases)}\n",
            content_type="text/plain; charset=utf-8")
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    with conf.using_database(shard):
        return HttpResponse(encoder(registry), content_type=content_type)
