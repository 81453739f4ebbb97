"""The console at ten million jobs (docs/console.md, "At ten million jobs"): the search by run id
of rows whose run id and id were not minted together, and one BRIN index over name, queue,
tenant, created_at and run_at for the jobs list's filters (models.py says why each, and why
BRIN, not b-trees).

Built ``concurrently``: a plain ``create index`` holds off every insert, claim and ack of
``x_jobs`` while it reads the whole table; so this migration is not atomic. Resumable
(``_online.AddIndexOnline``): a build that stopped midway is dropped and built again.
"""

import django.db.models.functions.comparison
import django.db.models.functions.text
import django.db.models.lookups
from django.db import migrations, models

import django_xjobs.models
from django_xjobs.migrations._online import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0004_observability'),
    ]

    operations = [
        AddIndexOnline(
            model_name='job',
            index=models.Index(condition=models.Q(django.db.models.lookups.Exact(django.db.models.functions.text.Left(django.db.models.functions.comparison.Cast(models.F('run_id'), models.TextField()), 13), django.db.models.functions.text.Left(django.db.models.functions.comparison.Cast(models.F('id'), models.TextField()), 13)), _negated=True), fields=['run_id'], name='x_jobs_run_apart_idx'),
        ),
        AddIndexOnline(
            model_name='job',
            index=django_xjobs.models.BrinIndex(fields=['name', 'queue', 'tenant_id', 'created_at', 'run_at'], name='x_jobs_console_brin', opclasses=['text_bloom_ops(n_distinct_per_range = 100)', 'text_bloom_ops(n_distinct_per_range = 100)', 'text_bloom_ops(n_distinct_per_range = 1000)', 'timestamptz_minmax_multi_ops', 'timestamptz_minmax_multi_ops']),
        ),
    ]
