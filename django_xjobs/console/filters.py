"""The console's list filters: the choices come from the settings and the registry, never from
``select distinct`` over a million rows (docs/console.md, "At ten million jobs")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import Q
from django.db.models.functions import Now
from django.http import HttpRequest

from .. import conf, registry
from ..exceptions import ConfigurationError
from ..records import ALL_STATES
from .reads import search
from .reads.scope import tenant_scope


class ChoiceOrTextFilter(admin.SimpleListFilter):
    """Choices the code knows (settings, registry) plus a text box for any other value: the
    choices never come from ``select distinct`` over a million rows. Up to :attr:`max_links`
    choices are links; more (a project with hundreds of job names) are the text box's
    suggestions, which the browser narrows as one types."""

    template = "admin/django_xjobs/choice_or_text_filter.html"
    field_name = ""
    max_links = 12
    placeholder = ""

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return ()

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in sorted(set(self.known(request, model_admin)))]

    def has_output(self) -> bool:
        return True  # the text box is useful even with no known choices

    # A condition of reads.search instead of the field's equality: the value's Q, and whether
    # it narrows the list as a search does (the list is then read table by table).
    match: Callable[[str], Q] | None = None
    searches: Callable[[str], bool] = staticmethod(lambda value: True)

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if not value:
            return queryset
        if self.match is None:
            return queryset.filter(**{self.field_name: value})
        if self.searches(value):
            search.mark_searched(request)
        try:
            return queryset.filter(self.match(value))
        except ConfigurationError as exc:  # nothing to look for: say so, list nothing
            messages.error(request, str(exc))
            return queryset.none()

    def choices(self, changelist: Any) -> Any:
        self.keep = [(k, v) for k, v in changelist.params.items()
                     if k != self.parameter_name]
        self.as_links = 0 < len(self.lookup_choices) <= self.max_links
        self.datalist = ([] if self.as_links or not self.lookup_choices
                         else [v for v, _ in self.lookup_choices])
        self.clear_url = changelist.get_query_string(remove=[self.parameter_name])
        if not self.placeholder:
            self.placeholder = f"exact {self.title}"
        yield from super().choices(changelist)


class QueueFilter(ChoiceOrTextFilter):
    title = "queue"
    parameter_name = field_name = "queue"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return [*conf.get().queues, *(j.queue for j in registry.all_jobs().values())]


class NameFilter(ChoiceOrTextFilter):
    title = "job name"
    parameter_name = field_name = "name"
    placeholder = "a name, or a pattern: shop.*"

    def known(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return registry.all_jobs().keys()

    match = staticmethod(search.name_match)
    searches = staticmethod(search.is_pattern)  # one name is the index's equality


class WorkerFilter(ChoiceOrTextFilter):
    """The worker that ran a job last (its id, ``web-1:4242``), or every worker of a host."""

    title = "worker"
    parameter_name = "worker"
    placeholder = "a worker id, or a host"
    match = staticmethod(search.worker_match)


class ErrorFilter(ChoiceOrTextFilter):
    """Jobs whose last error holds every word typed (``card declined``)."""

    title = "error"
    parameter_name = "error"
    placeholder = "words of the last error"
    match = staticmethod(search.error_search)


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
