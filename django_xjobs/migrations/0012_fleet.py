"""The fleet's compatibility (``x_fleet``, docs/deployment.md, "Mixed versions").

Old and new processes share the tables for the length of a rolling deploy. This version writes
two things release 0.1 cannot read: the ``blocked`` state (0.1's enqueue, relay and operator
paths know four live states and fail beside it) and the history tables (0.1's retry of a job
moved there breaks the table's CHECK). So when this migration upgrades tables an earlier version
has used (any row in its tables), it records that the fleet must stay compatible with 0.1; the
new workers then hold those writes back until ``manage.py xjobs fleet --finish-upgrade``. A
database no earlier version touched starts with no row: nothing older shares it.

Only a new, small table and a read of whether four tables hold a row (one row each): no lock on
any table a running process writes. Both in one transaction, skipped when the table exists
(a migrate stopped midway and run again; ``_online.py``).
"""

from django.db import migrations, models
from django.db.models.functions import Now

from django_xjobs.migrations._online import Once

# Written only where an earlier version left a trace: a job, a step, a slot, or a scheduler's
# leadership (a worker of 0.1 running on an empty queue still holds that). Only tables that live
# on the database of x_fleet: x_outbox may be on another (XJOBS["OUTBOX"]["DATABASES"]).
RECORD_UPGRADE = """
insert into x_fleet (id, compatible_with, changed_by)
select true, '0.1', 'migration 0012: these tables were used by an earlier version'
 where exists (select 1 from x_jobs)
    or exists (select 1 from x_job_steps)
    or exists (select 1 from x_job_leases)
    or exists (select 1 from x_scheduler_leader)
"""


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0011_fanin_index'),
    ]

    operations = [
        Once([
            migrations.CreateModel(
                name='Fleet',
                fields=[
                    ('id', models.BooleanField(db_default=True, default=True, primary_key=True, serialize=False)),
                    ('compatible_with', models.TextField(blank=True, null=True)),
                    ('changed_at', models.DateTimeField(db_default=Now())),
                    ('changed_by', models.TextField(db_default='', default='')),
                ],
                options={
                    'verbose_name': 'fleet',
                    'db_table': 'x_fleet',
                    'constraints': [models.CheckConstraint(condition=models.Q(('id', True)), name='x_fleet_one_row')],
                },
            ),
            migrations.RunSQL(RECORD_UPGRADE, reverse_sql=migrations.RunSQL.noop,
                              hints={"model_name": "fleet"}),
        ], done_if="select to_regclass('x_fleet') is not null"),
    ]
