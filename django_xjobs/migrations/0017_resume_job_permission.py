"""The console's resume_job permission: the resume of a dead workflow, its failed child
retried and its failed step opened again (docs/durable.md, "Repairing a dead workflow";
docs/console.md, "Permissions"). Options only: nothing in the database changes but the
permission Django creates after the migration.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('django_xjobs', '0016_history_search'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='job',
            options={'ordering': ['-id'], 'permissions': [('cancel_job', 'Can cancel jobs'), ('retry_job', 'Can retry dead or cancelled jobs'), ('resume_job', 'Can resume dead workflows'), ('run_job_now', 'Can make delayed or suspended jobs due now'), ('purge_job', 'Can delete finished jobs'), ('view_query_text', 'Can see the SQL text of other database sessions')], 'verbose_name': 'job'},
        ),
    ]
