"""The test settings with the worked example of docs/from-celery.md installed: the billing app
of example_project (tests/acceptance/test_celery_port.py runs its worker with them)."""

import sys
from pathlib import Path

from tests.settings import *  # noqa: F403

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "example_project"))

INSTALLED_APPS = [*INSTALLED_APPS, "billing"]  # noqa: F405
