"""When a job whose name its worker does not know began to wait (``x_jobs.unknown_since``;
docs/deployment.md, "New job types before their workers").

One DDL statement, ``ALTER TABLE x_jobs ADD COLUMN unknown_since timestamptz NULL``: a nullable
column without a default is a change of the catalog only (no table rewrite, no scan), and the
history tables, which inherit from x_jobs, get it the same way. It still takes the table's
ACCESS EXCLUSIVE lock for that instant, under the migrations' lock timeout with retries
(``_online.py``; docs/deployment.md, "Migrations on deploy")."""

from django.db import migrations, models

from django_xjobs.migrations._online import AddFieldOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0012_fleet'),
    ]

    operations = [
        AddFieldOnline(
            model_name='job',
            name='unknown_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
