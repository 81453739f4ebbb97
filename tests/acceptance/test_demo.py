"""`make demo` as a new user runs it: the example project's `manage.py demo` end to end, on a
database of its own, with a real worker process. The demo uses the public API and a few engine
calls, so a change that breaks one of them breaks the first thing a user tries."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.acceptance.test_package import fresh_database_url
from tests.conftest import ROOT
from tests.release_check import clean_env

pytestmark = pytest.mark.acceptance


def test_the_demo_runs_every_part_and_exits_zero():
    with fresh_database_url("demo") as url:
        env = {**clean_env(), "DATABASE_URL": url}
        done = subprocess.run([sys.executable, "manage.py", "demo"], cwd=ROOT / "example_project",
                              env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    for part in ("concurrency slots", "the workflows, resumed and finished",
                 "the operations console", "http://127.0.0.1:8000/_x/"):
        assert part in done.stdout, part
