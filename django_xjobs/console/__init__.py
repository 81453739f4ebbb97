"""The operations console: the Django admin as a read-only view of the queue, plus actions
(docs/console.md).

Pages: the dashboard and the health panel, a page per queue with its charts, the jobs list and
a job's page, and read-only lists of steps, events, outbox, concurrency slots, backfills and
the scheduler's leader and watermarks. The same model admins serve the project's admin and the
console's own site at ``/_x/``: every URL is reversed on the site that serves the page.

A module per concern, the way ``django.contrib.admin`` is laid out:

* :mod:`.sites`: the console's own admin site (``ConsoleSite``), mounted by
  ``django_xjobs/urls.py``; ``django_xjobs.console.site`` is its instance;
* :mod:`.options`: ``ConsoleAdmin``, what every model admin of the console shares (read-only,
  count-free, sort-free, tenant-aware; JSON columns read as text);
* the model admins: :mod:`.jobs` (the jobs list and a job's page), :mod:`.steps` (steps and
  events), :mod:`.outbox`, :mod:`.slots`, :mod:`.scheduler`, :mod:`.backfills`;
* :mod:`.actions`: the operator actions, which call the API, never ``queryset.update()``;
* :mod:`.views`: the dashboard, a queue's page, the health panel, pausing and resuming;
* :mod:`.filters`, :mod:`.paginator`, :mod:`.display`: list filters, the count-free
  paginator, how a value is shown;
* :mod:`.reads`: what the pages and ``manage.py xjobs`` show, one read model for both;
  :mod:`.charts`: the SVG charts of the counters.

``django_xjobs/admin.py``, which Django's admin autodiscovery imports, imports the model admins,
which register themselves with the project's admin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sites import site

__all__ = ["site"]


def __getattr__(name: str) -> Any:
    """``django_xjobs.console.site`` (docs/console.md), imported when first asked for: the
    command line reads through :mod:`.reads` without loading the admin, which a project may
    not have installed."""
    if name == "site":
        # Not at the top: the site imports django.contrib.admin and its models (see above).
        from .sites import site

        return site
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
