import os

from django.apps import AppConfig

from . import receivers


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        path = os.environ.get(receivers.ENV)
        if path:  # a worker of tests/acceptance/test_signals_worker.py
            receivers.connect(path)
        if os.environ.get("XJOBS_TEST_LATE_JOBS"):  # tests/acceptance/test_unknown_jobs_worker.py
            from . import late_jobs  # noqa: F401 - registers its job
