"""The worked example of docs/from-celery.md: example_project/billing/tasks.py is its Celery
original (tasks_celery.py) with the imports changed, and nothing else; its checkout flow
(a chord inside a chain, a bound task that retries, an autoretry, Decimal and datetime
arguments and results) runs on a real worker process, which finds the module as an installed
app's tasks.py."""

from __future__ import annotations

import difflib
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import ROOT

BILLING = ROOT / "example_project" / "billing"


def changed_lines(before: Path, after: Path) -> list[str]:
    diff = difflib.unified_diff(before.read_text().splitlines(), after.read_text().splitlines(),
                                lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_the_port_changed_the_imports_only():
    changed = changed_lines(BILLING / "tasks_celery.py", BILLING / "tasks.py")
    assert changed == [
        "-from celery import chain, chord, group, shared_task",
        "-from celery.result import AsyncResult",
        "+from django_xjobs.celery import chain, chord, group, shared_task",
        "+from django_xjobs.celery.result import AsyncResult",
    ]


@pytest.fixture
def billing(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "example_project"))
    import billing.tasks

    yield billing.tasks
    sys.modules.pop("billing.tasks", None)
    sys.modules.pop("billing", None)


def test_the_ported_checkout_runs_on_a_worker_that_found_it_in_tasks_py(billing, start_worker):
    start_worker("billing", "--concurrency", "4", env={
        "DJANGO_SETTINGS_MODULE": "tests.celery_port_settings"})
    at = datetime(2026, 12, 7, 9, 30, tzinfo=UTC)
    result = billing.checkout(42, [["tea", 2], ["cup", 1]], "ada@example.com", at)
    receipt = result.get(timeout=60)
    assert receipt == "receipt for order 42 (20.90) sent to ada@example.com"
    assert billing.status(result.id) == "SUCCESS"

    charged = billing.charge.delay(Decimal("20.90"), 43, at).get(timeout=60)
    assert charged == {"order": 43, "amount": Decimal("20.90"), "at": at, "tries": 3}

    declined = billing.checkout(44, [["pot", 4]], "bo@example.com", at)
    with pytest.raises(billing.CardDeclined, match="over the card limit"):
        declined.get(timeout=60)
    assert billing.status(declined.id) == "FAILURE"
