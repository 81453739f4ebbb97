"""What every page of the console shares: :class:`ConsoleAdmin`, the base of its model admins.

The admin reads; it never writes queue state through the ORM (docs/console.md). No add or change
forms exist: a person must not be able to put a row in a state no statement would produce.
Lists are count-free (:mod:`.paginator`) and sort-free: columns are not sortable (a sort of a
million rows is not a page view), the default order is the primary key (UUIDv7: newest first),
and every search and filter is answered by an index (the jobs list's: :mod:`.reads.search`).

Tenant scope: ``XJOBS["ADMIN_TENANT_SCOPE"]`` (:func:`.reads.scope.tenant_scope`) restricts
every queryset here; another tenant's row is a 404, and the pages of tables without a tenant
column are not shown. A page's JSON columns are read as text (:mod:`.reads.json_columns`), and
each has a page of its own for the whole value (:meth:`ConsoleAdmin.json_view`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connections, router
from django.db.models.functions import Now
from django.http import Http404, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from .databases import in_request_database
from .display import json_block
from .paginator import EstimatedCountPaginator
from .reads.json_columns import (
    JSON_PAGE_CHARS,
    json_fields,
    json_text,
    shown_json,
    with_json_text,
    without_json,
)
from .reads.scope import TenantScope, scoped, tenant_scope


def _nul_in(params: Any) -> bool:
    return any("\x00" in key or any("\x00" in v for v in params.getlist(key))
               for key in params)


class ConsoleAdmin(admin.ModelAdmin):
    """Read-only, count-free, sort-free, tenant-aware. Subclasses say how a row is in scope."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    sortable_by: Sequence[str] = ()
    list_per_page = 50
    tenant_field: str | None = None  # rows carry a tenant in this field
    hidden_under_scope = False  # no tenant column: not shown under ADMIN_TENANT_SCOPE

    class Media:
        css = {"all": ("django_xjobs/console.css",)}

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        if self.hidden_under_scope and tenant_scope(request) is not None:
            return False
        return super().has_view_permission(request, obj)

    def has_module_permission(self, request: Any) -> bool:
        if self.hidden_under_scope and tenant_scope(request) is not None:
            return False
        return super().has_module_permission(request)

    def scope_queryset(self, queryset: Any, tenants: TenantScope) -> Any:
        if tenants is None:
            return queryset
        if self.tenant_field is None:
            return queryset.none()
        return scoped(queryset, tenants, self.tenant_field)

    def get_queryset(self, request: Any) -> Any:
        # No page's list shows a JSON column: leave them out (see
        # reads.json_columns.JSON_FIELDS); a page that shows one reads it as text (get_object).
        queryset = without_json(
            self.scope_queryset(super().get_queryset(request), tenant_scope(request)))
        if _nul_in(request.GET):
            # PostgreSQL refuses NUL in text, so a filter or search value with one would be a
            # database error; no stored value contains one, so nothing matches (the list says
            # why: changelist_view). tests/integration/test_console_rows.py pins every list.
            return queryset.none()
        return queryset

    def changelist_view(self, request: Any, extra_context: dict[str, Any] | None = None) -> Any:
        if _nul_in(request.GET):
            self.message_user(request, "A filter or search value contains a NUL character, "
                              "which no stored value can contain: nothing matches.",
                              messages.ERROR)
        with without_jit(router.db_for_read(self.model)):
            return _rendered(super().changelist_view(request, extra_context))

    def get_object(self, request: Any, object_id: str, from_field: str | None = None) -> Any:
        return self._find(request, object_id, JSON_PAGE_CHARS)

    def _find(self, request: Any, object_id: str, limit: int | None) -> Any:
        """The row of a page, in scope, its JSON columns read as text (at most ``limit``
        characters of each: see with_json_text), or None."""
        if "\x00" in str(object_id):
            return None  # no key contains NUL, and PostgreSQL refuses one in a text key
        pk = self.model._meta.pk
        try:
            value = pk.to_python(object_id)
        except (ValidationError, ValueError):
            return None
        return with_json_text(self.get_queryset(request), limit).filter(
            **{pk.name: value}).first()

    @property
    def urls(self) -> list[Any]:
        """Every page of this admin (its own and the admin's) in its request's database: the
        shard chosen, reads on the replica (:mod:`.databases`)."""
        patterns = self.get_urls()
        for pattern in patterns:
            if isinstance(pattern, URLPattern):
                pattern.callback = in_request_database(pattern.callback)
        return patterns

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path("<path:object_id>/json/<str:field>/",
                 self.admin_site.admin_view(self.json_view), name="{}_{}_json".format(*info)),
            *super().get_urls(),
        ]

    def json_view(self, request: Any, object_id: str, field: str) -> HttpResponse:
        """The whole of one JSON column of one row, as the database stores it (pages show at
        most JSON_PAGE_CHARS characters and link here). Nothing is decoded: jsonb's text is
        JSON even when Python's json module cannot load it. Same permission and tenant scope
        as the row's page."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if field not in json_fields(self.model):
            raise Http404(f"{self._meta_name()} has no JSON column {field!r}")
        obj = self._find(request, unquote(object_id), None)
        if obj is None:
            raise Http404(f"no {self._meta_name()} {object_id!r}")
        response = HttpResponse(json_text(obj, field) or "null",
                                content_type="application/json; charset=utf-8")
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def url(self, name: str, *args: Any) -> str:
        """The URL of page ``name`` of the site this admin belongs to: the project's admin or
        the console at ``/_x/`` (docs/console.md), which register the same classes."""
        return reverse(f"{self.admin_site.name}:{name}", args=args)

    def job_html(self, job_id: Any) -> str:
        """A link to the page of job ``job_id`` (a row's job), or "-" for none."""
        if job_id is None:
            return "-"
        return format_html('<a href="{}">{}</a>', self.url("django_xjobs_job_change", job_id),
                           job_id)

    def whole_json_url(self, obj: Any, field: str) -> str:
        info = self.opts.app_label, self.opts.model_name
        return self.url("{}_{}_json".format(*info), obj.pk, field)

    def json_html(self, obj: Any, field: str) -> str:
        return json_block(shown_json(obj, field), self.whole_json_url(obj, field))

    def _object_or_404(self, request: Any, object_id: str) -> Any:
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            # A foreign tenant's row and a row that does not exist look the same: 404.
            raise Http404(f"no {self._meta_name()} {object_id!r}")
        return obj

    def _meta_name(self) -> str:
        return str(self.model._meta.verbose_name)

    def change_view(self, request: Any, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        with without_jit(router.db_for_read(self.model)):
            self._object_or_404(request, object_id)
            return _rendered(super().change_view(request, object_id, form_url, extra_context))

    def history_view(self, request: Any, object_id: str,
                     extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        self._object_or_404(request, object_id)
        return super().history_view(request, object_id, extra_context)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        declared = list(super().get_readonly_fields(request, obj))
        hidden = set(self.exclude or ())  # shown by a declared display method instead
        return declared + [f.name for f in self.model._meta.concrete_fields
                           if f.name not in declared and f.name not in hidden]


class ClockedAdmin(ConsoleAdmin):
    """Rows carry the database clock (``db_clock``), so "expired?" costs no query per row."""

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).annotate(db_clock=Now())

    @staticmethod
    def unexpired(obj: Any) -> bool:
        """Whether the row's ``expires_at`` is still ahead of the database clock."""
        return bool(obj.expires_at > obj.db_clock)


@contextmanager
def without_jit(using: str) -> Iterator[None]:
    """The console's reads without PostgreSQL's JIT, restored after: a list over the history
    tables (a "created today" range at ten million jobs) costs past ``jit_above_cost``, and
    compiling it took 485 ms to save a few (docs/console.md, "At ten million jobs"). The
    setting is the session's, so it is put back for the connection's next user."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute("select current_setting('jit'), set_config('jit', 'off', false)")
        (before, _off) = cursor.fetchone()
    try:
        yield
    finally:
        if not connection.needs_rollback:
            with connection.cursor() as cursor:
                cursor.execute("select set_config('jit', %s, false)", [before])


def _rendered(response: Any) -> Any:
    """A template response rendered now, while :func:`without_jit` holds: its template reads
    querysets too."""
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        render()
    return response
