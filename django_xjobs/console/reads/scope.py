"""The tenant scope of a console request, and querysets restricted to it.

``XJOBS["ADMIN_TENANT_SCOPE"]`` names the tenants a request may see and touch; every read of
the console and every action's statement is restricted to them (the package's docstring says
what is not shown at all under a scope).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.utils.module_loading import import_string

from ... import conf
from ...exceptions import ConfigurationError
from ...models import Job

TenantScope = frozenset[str] | None

def tenant_scope(request: Any) -> TenantScope:
    """The tenants this request may see and touch, or None for all of them.

    ``XJOBS["ADMIN_TENANT_SCOPE"]`` is a callable or its dotted path. It must return None or a
    collection of tenant id strings; anything else is a configuration error, raised (rather
    than read as "everything") so a broken scope never shows one tenant another's jobs.
    """
    scope_fn = _scope_callable()
    if scope_fn is None:
        return None
    value = scope_fn(request)
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigurationError(
            f'XJOBS["ADMIN_TENANT_SCOPE"] returned {value!r}; it must return None (every '
            "tenant) or a set of tenant id strings"
        )
    tenants = frozenset(value)
    bad = [t for t in tenants if not isinstance(t, str)]
    if bad:
        raise ConfigurationError(
            f'XJOBS["ADMIN_TENANT_SCOPE"] returned non-string tenant ids {bad[:5]!r}'
        )
    return tenants


def _scope_callable() -> Callable[[Any], Any] | None:
    raw = conf.get().raw.get("ADMIN_TENANT_SCOPE")
    if raw is None:
        return None
    if callable(raw):
        return raw  # type: ignore[no-any-return]

    try:
        found = import_string(raw)
    except ImportError as exc:
        raise ConfigurationError(
            f'XJOBS["ADMIN_TENANT_SCOPE"] = {raw!r} cannot be imported: {exc}'
        ) from exc
    if not callable(found):
        raise ConfigurationError(f'XJOBS["ADMIN_TENANT_SCOPE"] = {raw!r} is not callable')
    return found  # type: ignore[no-any-return]


def scoped(queryset: Any, tenants: TenantScope, field_name: str = "tenant_id") -> Any:
    """``queryset`` restricted to the scope's tenants (unchanged without a scope)."""
    if tenants is None:
        return queryset
    return queryset.filter(**{f"{field_name}__in": sorted(tenants)})


def steps_scoped(queryset: Any, tenants: TenantScope) -> Any:
    """Steps have no tenant column: a step is in scope when its run's job is."""
    if tenants is None:
        return queryset

    return queryset.filter(run_id__in=Job.objects.filter(tenant_id__in=sorted(tenants))
                           .values("run_id"))
