"""The console's view_query_text permission: the SQL text of other database sessions on the
health panel is for superusers and this permission's holders (docs/console.md, "Permissions").
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('django_xjobs', '0001_initial'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='job',
            options={'ordering': ['-id'], 'permissions': [('cancel_job', 'Can cancel jobs'), ('retry_job', 'Can retry dead or cancelled jobs'), ('run_job_now', 'Can make delayed or suspended jobs due now'), ('purge_job', 'Can delete finished jobs'), ('view_query_text', 'Can see the SQL text of other database sessions')], 'verbose_name': 'job'},
        ),
    ]
