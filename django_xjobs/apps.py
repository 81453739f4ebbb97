"""The Django app: autodiscovers each installed app's ``jobs.py`` and registers the checks."""

from __future__ import annotations

from importlib.util import find_spec

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from . import checks, conf
from .testing import inline


class XJobsConfig(AppConfig):
    name = "django_xjobs"
    label = "django_xjobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        conf.connect_signals()
        checks.register()
        # ---- the inline test mode (docs/testing.md): enqueue hands new jobs to its runner
        # while XJOBS["TEST_MODE"] is "inline" (override_settings included).
        inline.install()
        # Found the way the admin finds admin.py: import every installed app's jobs.py.
        autodiscover_modules("jobs")

        # ---- django.tasks backend (Django 6+): finish early @task declarations and, when a
        # TASKS backend is django_xjobs.tasks.XJobsBackend, import each installed app's tasks.py.
        if find_spec("django.tasks") is not None:
            from . import tasks  # imports django.tasks, which Django 5.2 does not have

            tasks.ready()
