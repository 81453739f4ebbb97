"""The index of the invoke steps whose last child finished (``x_job_steps_fanin_idx``), which
``jobs_unblock`` reads to wake a suspended parent that its child's trigger skipped because
another transaction held the parent's row (migration 0010). Built CONCURRENTLY, in a migration
of its own (a concurrent build cannot run in a transaction): writers of x_job_steps, the
workers' step writes among them, go on while it is built."""

from django.db import migrations, models

from django_xjobs.migrations._online import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('django_xjobs', '0010_never_stalled'),
    ]

    operations = [
        AddIndexOnline(
            model_name='jobstep',
            index=models.Index(condition=models.Q(('pending__lte', 0), ('status', 'invoking')), fields=['run_id'], name='x_job_steps_fanin_idx'),
        ),
    ]
