"""Resumable data backfills: ``@backfill`` and :class:`Batch`, and the passes that run them.

A backfill walks a table in batches with a cursor of its own choosing (a keyset: the last id it
touched)::

    @backfill("accounts.normalize_emails", batch_size=1000)
    def normalize_emails(ctx, cursor):
        ids = list(User.objects.filter(pk__gt=cursor or 0).order_by("pk")
                   .values_list("pk", flat=True)[:ctx.batch_size])
        User.objects.filter(pk__in=ids).update(email=Lower("email"))
        return Batch(ids[-1] if len(ids) == ctx.batch_size else None, len(ids))

The public surface, importable from here (docs/backfills.md):

* declaring: :func:`backfill` (also ``django_xjobs.backfill``), :class:`Batch` (also
  ``django_xjobs.Batch``), the :class:`BackfillContext` a batch receives as ``ctx`` and the
  :class:`BackfillDefinition` the decorator returns (``my_backfill.start()``,
  ``@my_backfill.total``);
* operating passes, what ``manage.py xjobs_backfill`` does: :func:`start`, :func:`list_passes`,
  :func:`get_pass`, :func:`cancel`, :func:`retry`, :func:`progress`, :func:`dry_run`, and what
  they return (:class:`PassHandle`, :class:`PassChange`, :class:`Progress`,
  :class:`DryRunReport`, :class:`DryRunBatch`).

The rest is internal, one concern per module:

* ``definition.py``: a backfill's declaration, validated, and what one batch may return;
* ``registry.py``: ``@backfill`` and the map from a backfill's name to its definition;
* ``provenance.py``: which code processed a pass (checksum, app version);
* ``passes.py``: running a pass in its job, batch by batch, each batch fenced; its docstring
  is the design of the pass protocol (states, what commits with what, timeouts);
* ``operations.py``: start, list, show, cancel, retry a pass, and its progress;
* ``dry_runs.py``: :func:`dry_run`, batches run here and rolled back.
"""

from __future__ import annotations

from .definition import BackfillContext, BackfillDefinition, Batch, PassHandle
from .dry_runs import DryRunBatch, DryRunReport, dry_run
from .operations import (
    PassChange,
    Progress,
    cancel,
    get_pass,
    list_passes,
    progress,
    retry,
    start,
)
from .registry import backfill

__all__ = [
    "BackfillContext",
    "BackfillDefinition",
    "Batch",
    "DryRunBatch",
    "DryRunReport",
    "PassChange",
    "PassHandle",
    "Progress",
    "backfill",
    "cancel",
    "dry_run",
    "get_pass",
    "list_passes",
    "progress",
    "retry",
    "start",
]
