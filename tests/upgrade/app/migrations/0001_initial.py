from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []

    operations = [
        migrations.CreateModel(
            name="Execution",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("job_id", models.UUIDField()),
                ("attempt", models.IntegerField()),
                ("what", models.TextField()),
                ("side", models.TextField()),
                ("by", models.TextField()),
                ("pid", models.IntegerField()),
                ("at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "db_table": "upgrade_executions",
                "indexes": [models.Index(fields=["job_id"], name="upgrade_exec_job_idx")],
            },
        ),
    ]
