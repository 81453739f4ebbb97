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

try:  # pragma: no cover - exercised in both states by the test matrix
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover
    _propagate = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]


def otel_available() -> bool:
    """Whether the OpenTelemetry API is installed."""
    return _trace is not None


def wants_span(traceparent: str | None) -> bool:
    """Whether a job should run inside :func:`job_span`.

    With a traceparent, always (when the API is installed): the job's code then sees the
    enqueuer's trace as current, so what it calls carries it on. Without one, only when an SDK
    records spans: with the API alone a new root span is a no-op that costs every job."""
    if _trace is None:
        return False
    if traceparent:
        return True
    return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)


def current_traceparent() -> str | None:
    """The traceparent of the current OpenTelemetry span, or None (no OTel, no valid span)."""
    if _propagate is None:
        return None
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    value = carrier.get("traceparent")
    return value if value and valid_traceparent(value) else None


@contextlib.contextmanager
def job_span(name: str, traceparent: str | None, attributes: dict[str, Any]) -> Iterator[None]:
    """Run a job inside a span that is a child of ``traceparent`` (no-op without OTel)."""
    if _trace is None or _propagate is None:
        yield
        return
    parent = _propagate.extract({"traceparent": traceparent}) if traceparent else None
    tracer = _trace.get_tracer("django_xjobs")
    with tracer.start_as_current_span(
        f"xjobs {name}", context=parent, kind=_trace.SpanKind.CONSUMER, attributes=attributes
    ):
        yield
