"""The Django app: autodiscovers each installed app's ``jobs.py`` and ``tasks.py`` and
registers the checks."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from importlib import import_module
from importlib.util import find_spec

from django.apps import AppConfig, apps
from django.conf import settings
from django.utils.module_loading import autodiscover_modules, module_has_submodule

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
        # And its tasks.py, where Celery's tasks live (django_xjobs.celery,
        # docs/from-celery.md); after the django.tasks backend's own, which imports them first
        # when it may declare some.
        _discover_tasks_modules()


logger = logging.getLogger("django_xjobs")

# The task queues a project may be leaving (docs/from-celery.md): an app's tasks.py that needs
# one of them, not installed in this environment, is skipped with a warning instead of stopping
# every process of the project at start-up. So is one of django.tasks' under Django 5.2.
_OTHER_QUEUES = frozenset({"celery", "kombu", "dramatiq", "rq", "huey"})


def _discover_tasks_modules() -> None:
    """Import every installed app's ``tasks.py``, as ``jobs.py``: the tasks of
    ``django_xjobs.celery`` (and ``django.tasks``') live there. An error raised by the module
    stops start-up, as one in ``jobs.py`` does, but for the import of another queue's package
    that is not installed (a module not ported yet, or a third-party app's Celery tasks)."""
    for config in apps.get_app_configs():
        # Our own `tasks` is the django.tasks backend, imported only when TASKS names it.
        if config.name == XJobsConfig.name or not module_has_submodule(config.module, "tasks"):
            continue
        try:
            import_module(f"{config.name}.tasks")  # an installed app's module, not the package's
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing == "django.tasks":
                continue  # django.tasks' tasks, under a Django before 6
            if missing.partition(".")[0] not in _OTHER_QUEUES:
                raise
            logger.warning("django-xjobs: skipped %s.tasks: it imports %s, which is not "
                           "installed (docs/from-celery.md)", config.name, missing)


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
