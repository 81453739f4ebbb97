"""Template filters of the operations console: times relative to the database clock, sizes,
state badges; and the breadcrumbs of the console's own pages, rendered by the admin's."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

from django import template
from django.template import Context
from django.template.loader import get_template
from django.template.loader_tags import BlockNode, ExtendsNode
from django.utils.html import format_html

from .. import conf
from ..console import display
from ..console.databases import SHARD_FIELD
from ..console.reads import text

register = template.Library()


@register.filter
def ago(moment: datetime | None, now: datetime) -> str:
    """``{{ job.finished_at|ago:db_now }}`` -> "3 min ago" / "in 20 s" / "never"."""
    return text.ago(moment, now)


@register.filter
def seconds(value: float | None) -> str:
    return text.humanize_seconds(value)


@register.filter
def thousands(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else ("-" if value is None else str(value))


@register.filter
def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


@register.filter
def share(part: int | None, whole: int | None) -> str:
    if not part or not whole:
        return "0%"
    return f"{part / whole:.0%}"


@register.filter
def filesize(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


register.filter("badge", display.badge)


@register.simple_tag(takes_context=True)
def xjobs_shard_field(context: template.Context) -> str:
    """In a console form: the shard the page showed, so that its POST acts there even if
    another tab has chosen another shard since (console/databases.py)."""
    shard = getattr(context.get("request"), "xjobs_shard", None)
    if shard is None:
        return ""
    return format_html('<input type="hidden" name="{}" value="{}">', SHARD_FIELD, shard)


@register.inclusion_tag("admin/django_xjobs/live.html")
def xjobs_live() -> dict[str, Any]:
    """``{% xjobs_live %}``: the live-update indicator and its script (docs/console.md, "Live
    updates"), at ``XJOBS["CONSOLE_REFRESH"]``; nothing when that is None."""
    every = conf.get().console_refresh
    return {"interval_ms": None if every is None else round(every * 1000)}


# The stock page whose breadcrumbs have the shape of an action's confirmation: Home > the app >
# the model's list > this page. Its structure changes between Django versions (6.1 turned the
# <div class="breadcrumbs"> into an <ol>, and the admin's CSS now styles only the <ol>); copied
# markup goes stale, so the console renders that template's own block instead.
# tests/acceptance/test_console_browser.py compares the result with a stock page in chromium.
BREADCRUMBS_TEMPLATE = "admin/change_form.html"
# The stock page whose breadcrumbs have the shape of the console's own pages (the dashboard, a
# queue, the health panel, a pause): Home > the app > this page.
PAGE_BREADCRUMBS_TEMPLATE = "admin/change_list.html"


def _find_block(name: str, template_name: str) -> BlockNode | None:
    """Block ``name`` of ``template_name`` as the project resolves it: its own, else the one of
    the template it extends (a project may override admin/change_form.html)."""

    current = get_template(template_name).template  # type: ignore[attr-defined]
    for _ in range(10):  # an extends chain is short; never loop on a malformed one
        for node in current.nodelist.get_nodes_by_type(BlockNode):
            if node.name == name:
                return node  # type: ignore[no-any-return]
        parents = current.nodelist.get_nodes_by_type(ExtendsNode)
        if not parents:
            return None
        current = parents[0].get_parent(Context())
    return None


@register.simple_tag(takes_context=True)
def admin_breadcrumbs(context: template.Context, label: str) -> str:
    """``{% admin_breadcrumbs title %}``: the admin's change-form breadcrumbs (Home > app >
    model list > ``label``) for the page's ``opts``, in the installed Django's markup; "" when
    the project's templates have no such block (the page then keeps base.html's)."""
    block = _find_block("breadcrumbs", BREADCRUMBS_TEMPLATE)
    if block is None:
        return ""
    with context.push(block=block, original=label, add=False, is_popup=False,
                      has_view_permission=True):
        return block.nodelist.render(context)  # type: ignore[no-any-return]


@register.simple_tag(takes_context=True)
def console_breadcrumbs(context: template.Context, label: str) -> str:
    """``{% console_breadcrumbs "Dashboard" %}``: the admin's change-list breadcrumbs (Home >
    app > ``label``) for the page's ``opts``, in the installed Django's markup: the console's
    own pages sit beside the models' lists, not under the jobs list. "" when the project's
    templates have no such block (the page then keeps base.html's)."""
    block = _find_block("breadcrumbs", PAGE_BREADCRUMBS_TEMPLATE)
    opts = context.get("opts")
    if block is None or opts is None:
        return ""
    # The list's own crumb is its model's name: this page's label stands in for it.
    page = SimpleNamespace(app_label=opts.app_label, app_config=opts.app_config,
                           model_name=opts.model_name, verbose_name=label,
                           verbose_name_plural=label)
    with context.push(block=block, cl=SimpleNamespace(opts=page), is_popup=False):
        return block.nodelist.render(context)  # type: ignore[no-any-return]
