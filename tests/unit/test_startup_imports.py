"""What start-up imports in a project that does not use the django.tasks backend: neither the
backend nor django.tasks (docs/performance.md, "Worker start-up"), while every installed app's
tasks.py is (django_xjobs/apps.py). Run in a fresh interpreter: the suite's own process has
imported everything already."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = textwrap.dedent("""
    import sys
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_xjobs",
                        "billing"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}},
    )
    django.setup()
    print(sorted(m for m in ("django_xjobs.tasks", "django.tasks", "billing.tasks")
                 if m in sys.modules))
""")


def test_start_up_imports_the_apps_tasks_modules_but_not_the_django_tasks_backend():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
        cwd=ROOT, env={"PYTHONPATH": f"{ROOT}:{ROOT / 'example_project'}",
                       "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['billing.tasks']"
