from django.apps import AppConfig


class UpgradeAppConfig(AppConfig):
    name = "tests.upgrade.app"
    label = "upgradeapp"
    default_auto_field = "django.db.models.BigAutoField"
