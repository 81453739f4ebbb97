"""An idempotency window survives the outbox: x_outbox.unique_for_ms (docs/durable.md,
"Idempotency windows")."""

from django.db import migrations, models

from django_xjobs.migrations._online import AddFieldOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0007_durable_further'),
    ]

    operations = [
        AddFieldOnline(
            model_name='outboxentry',
            name='unique_for_ms',
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
