"""An idempotency window survives the outbox: x_outbox.unique_for_ms (docs/durable.md,
"Idempotency windows")."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_xjobs', '0007_durable_further'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboxentry',
            name='unique_for_ms',
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
