"""Vacuum and analyze the hot table sooner than PostgreSQL's defaults do.

Every claim and every acknowledgement leaves a dead row version in x_jobs (the updates change
the state, which the partial indexes depend on, so they cannot be HOT updates). With the default
scale factors autovacuum waits for 20 % of the table to be dead; on a million-row history that
is 200,000 dead versions the claim's index scan must step over. 2 % keeps the claim path short.
See docs/performance.md ("PostgreSQL settings").
"""

from django.db import migrations

SET = """
alter table x_jobs set (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
)
"""
RESET = """
alter table x_jobs reset (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_analyze_scale_factor
)
"""


class Migration(migrations.Migration):
    dependencies = [("django_xjobs", "0002_live_key_skips_default_keys")]
    operations = [migrations.RunSQL(SET, RESET)]
