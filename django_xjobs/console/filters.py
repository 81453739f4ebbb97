"""The console's list filters: the choices come from the settings and the registry, never from
``select distinct`` over a million rows (docs/console.md, "At ten million jobs")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models.functions import Now
from django.http import HttpRequest

from .. import conf, registry
from ..records import ALL_STATES
from .reads.scope import tenant_scope


class ChoiceOrTextFilter(admin.SimpleListFilter):
    """Choices the code knows (settings, registry) plus a text box for any other value: the
    choices never come from ``select distinct`` over a million rows."""

    template = "admin/django_xjobs/choice_or_text_filter.html"
    field_name = ""

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return ()

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in sorted(set(self.known(request, model_admin)))]

    def has_output(self) -> bool:
        return True  # the text box is useful even with no known choices

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value:
            return queryset.filter(**{self.field_name: value})
        return queryset

    def choices(self, changelist: Any) -> Any:
        self.keep = [(k, v) for k, v in changelist.params.items()
                     if k != self.parameter_name]
        yield from super().choices(changelist)


class QueueFilter(ChoiceOrTextFilter):
    title = "queue"
    parameter_name = field_name = "queue"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return [*conf.get().queues, *(j.queue for j in registry.all_jobs().values())]


class NameFilter(ChoiceOrTextFilter):
    title = "job name"
    parameter_name = field_name = "name"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return registry.all_jobs().keys()


class TenantFilter(ChoiceOrTextFilter):
    title = "tenant"
    parameter_name = "tenant"
    field_name = "tenant_id"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return tenant_scope(request) or ()


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"
    LAPSED = "lapsed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in ALL_STATES] + [(self.LAPSED, "running, lease expired")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value == self.LAPSED:
            return queryset.filter(state="running", visible_at__lte=Now())
        if value in ALL_STATES:
            return queryset.filter(state=value)
        return queryset


class StepStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in ("completed", "failed", "sleeping", "waiting", "cancelled")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(status=self.value()) if self.value() else queryset


class EventNameFilter(ChoiceOrTextFilter):
    title = "event name"
    parameter_name = field_name = "name"


class OutboxPendingFilter(admin.SimpleListFilter):
    title = "relayed"
    parameter_name = "pending"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "pending (not relayed yet)"), ("no", "published")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() == "yes":
            return queryset.filter(published_at=None)
        if self.value() == "no":
            return queryset.exclude(published_at=None)
        return queryset
