"""The fair claim's index, made unusable by any other statement (``x_jobs_fair_tenant_idx``
replaces ``x_jobs_fair_idx``; docs/performance.md, "Under a held horizon").

``x_jobs_fair_idx`` and ``x_jobs_claim_idx`` cover the same rows, both led by the queue. The
claim of a queue that is not fair reads the claim index from its floor; the planner could
pick the fair index for it as well (the claim's plan is generic, and the two cost about the
same while the table is small), where nothing bounds the scan but the queue: it then read
every dead entry of the queue while a long transaction held the horizon. The new index has
the same key and adds ``coalesce(tenant_id, '') IS NOT NULL`` (always true) to its predicate:
PostgreSQL uses a partial index only for a statement whose conditions imply its predicate,
and only the fair claim's scans name that expression.

Built CONCURRENTLY before the old one is dropped CONCURRENTLY (neither blocks the writers of
x_jobs). A worker of the previous release still claims fair queues correctly, with a slower
walk over their tenants until it is replaced (the first tenant's scan of its walk does not
name the expression).
"""

from django.db import migrations, models
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.db.models.lookups import IsNull

from django_xjobs.migrations._online import AddIndexOnline, RemoveIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0014_archive_floor'),
    ]

    operations = [
        AddIndexOnline(
            model_name='job',
            index=models.Index(
                F('queue'), Coalesce(F('tenant_id'), Value('')), F('priority').desc(),
                F('run_at'),
                condition=Q(state__in=('ready', 'delayed', 'suspended')) & Q(IsNull(
                    Coalesce(F('tenant_id'), Value(''), output_field=models.TextField()),
                    False)),
                name='x_jobs_fair_tenant_idx',
            ),
        ),
        RemoveIndexOnline(
            model_name='job',
            name='x_jobs_fair_idx',
        ),
    ]
