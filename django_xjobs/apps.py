"""The Django app: autodiscovers each installed app's ``jobs.py`` and registers the checks."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib.util import find_spec

from django.apps import AppConfig
from django.conf import settings
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
        if find_spec("django.tasks") is not None and _tasks_may_be_ours():
            from . import tasks  # imports django.tasks, which Django 5.2 does not have

            tasks.ready()


# The backends django.tasks ships: none of them is ours, or a subclass of ours.
_DJANGO_BACKENDS = "django.tasks.backends."


def _tasks_may_be_ours() -> bool:
    """Whether this process may have tasks for django_xjobs.tasks.XJobsBackend: its module was
    imported already (an @task declared before the registry was ready waits in it), or TASKS
    names a backend that is not one of django.tasks' own. Otherwise (Django's default TASKS,
    as in a project that does not use django.tasks) neither module is imported: django.tasks
    and our backend are milliseconds of every process's start-up, a worker's included
    (docs/performance.md, "Worker start-up")."""
    if "django_xjobs.tasks" in sys.modules:
        return True
    backends = getattr(settings, "TASKS", None)
    if not isinstance(backends, Mapping):
        return True  # tasks.ready() and django.tasks' own checks deal with it
    return any(
        not (isinstance(params, Mapping) and isinstance(params.get("BACKEND"), str)
             and params["BACKEND"].startswith(_DJANGO_BACKENDS))
        for params in backends.values()
    )
