"""W3C trace context for jobs, through OpenTelemetry when it is installed (optional extra).

Enqueue records the ``traceparent`` of the enqueuing code; the worker exposes it as
``ctx.traceparent`` and, with OpenTelemetry installed, runs the job in a child span of it, so a
request and the jobs it caused show up as one trace.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")


def valid_traceparent(value: object) -> bool:
    """A W3C ``traceparent``: the format, and none of the values the spec calls invalid
    (version ff, an all-zero trace id or parent id)."""
    if not isinstance(value, str) or not TRACEPARENT_RE.match(value):
        return False
    version, trace_id, parent_id, _flags = value.split("-")
    return version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16

_UNLOADED: Any = object()
_otel: Any = _UNLOADED  # (propagate, trace) once looked for; None when not installed


def _api() -> tuple[Any, Any] | None:
    """OpenTelemetry's ``propagate`` and ``trace`` modules, or None when it is not installed.
    Looked for at the first call, not at import: a worker process imports this module before
    its first claim, and the API's import is a few milliseconds of start-up that the first
    job's span can pay instead (docs/performance.md, "Worker start-up")."""
    global _otel
    if _otel is _UNLOADED:
        try:  # pragma: no cover - exercised in both states by the test matrix
            from opentelemetry import propagate, trace  # optional; first use pays, not start-up
        except ImportError:  # pragma: no cover
            _otel = None
        else:
            _otel = (propagate, trace)
    return _otel  # type: ignore[no-any-return]


def otel_available() -> bool:
    """Whether the OpenTelemetry API is installed."""
    return _api() is not None


def wants_span(traceparent: str | None) -> bool:
    """Whether a job should run inside :func:`job_span`.

    With a traceparent, always (when the API is installed): the job's code then sees the
    enqueuer's trace as current, so what it calls carries it on. Without one, only when an SDK
    records spans: with the API alone a new root span is a no-op that costs every job."""
    otel = _api()
    if otel is None:
        return False
    if traceparent:
        return True
    trace = otel[1]
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def current_traceparent() -> str | None:
    """The traceparent of the current OpenTelemetry span, or None (no OTel, no valid span)."""
    otel = _api()
    if otel is None:
        return None
    carrier: dict[str, str] = {}
    otel[0].inject(carrier)
    value = carrier.get("traceparent")
    return value if value and valid_traceparent(value) else None


@contextlib.contextmanager
def job_span(name: str, traceparent: str | None, attributes: dict[str, Any]) -> Iterator[None]:
    """Run a job inside a span that is a child of ``traceparent`` (no-op without OTel)."""
    otel = _api()
    if otel is None:
        yield
        return
    propagate, trace = otel
    parent = propagate.extract({"traceparent": traceparent}) if traceparent else None
    tracer = trace.get_tracer("django_xjobs")
    with tracer.start_as_current_span(
        f"xjobs {name}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    ):
        yield
