"""Jobs declared before the app registry is ready (a settings module or an app's ``__init__``
importing them): tests/unit/test_registry.py::test_every_option_is_known_before_django_setup.
No models here, so the module imports before ``django.setup()``."""

from django_xjobs import Concurrency, job


@job(cron="0 3 * * *", timezone="Europe/Paris", misfire="skip")
def nightly(ctx):
    return None


@job(concurrency=Concurrency(key="export:{account}", limit=1), queue="exports")
def export(ctx, account: int):
    return account
