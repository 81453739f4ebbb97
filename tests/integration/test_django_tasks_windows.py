"""Idempotency windows through the ``django.tasks`` backend (docs/django-tasks.md): ``unique_for``
on ``@task`` or ``using()``, with an idempotency key, dedupes against a task of that key that
finished less than the window ago, as ``.using(unique_for=...)`` does for a job
(tests/integration/test_idempotency_windows.py). Skipped on Django < 6.0."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("django.tasks", reason="django.tasks (and this backend) need Django 6.0+")

from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask

from django_xjobs.models import Job, JobKey, OutboxEntry
from django_xjobs.tasks import XJobsTask, declarations
from django_xjobs.testing import drain
from tests.testapp import tasks as t


@pytest.fixture
def declare():
    """Declare tests.testapp.tasks.undeclared with the given options; forget it afterwards."""
    path = "tests.testapp.tasks.undeclared"

    def make(**options):
        return XJobsTask(func=t.undeclared, **options)

    yield make
    declarations.forget(path)


@pytest.mark.django_db(transaction=True)
def test_a_finished_task_inside_its_window_is_the_answer():
    windowed = t.add.using(idempotency_key="tw:add", unique_for=timedelta(hours=1))
    first = windowed.enqueue(1, 2)
    drain()
    again = windowed.enqueue(5, 5)
    assert again.id == first.id
    assert again.status == TaskResultStatus.SUCCESSFUL and again.return_value == 3
    assert Job.objects.filter(idempotency_key="tw:add").count() == 1
    assert JobKey.objects.get(key="tw:add").job_id == Job.objects.get(pk=first.id).id
    # Without unique_for the same key makes a new task once the first one finished.
    assert t.add.using(idempotency_key="tw:add").enqueue(1, 1).id != first.id


@pytest.mark.django_db(transaction=True)
def test_a_declared_window_and_the_outbox_path_carry_it(declare):
    task = declare(idempotency_key=lambda x: f"tw:{x}", unique_for="forever")
    first = task.enqueue("a")
    drain()
    assert Job.objects.get(pk=first.id).unique_for_ms == -1
    with transaction.atomic():
        staged = task.enqueue_on_commit("a")
    drain()
    assert Job.objects.filter(idempotency_key="tw:a").count() == 1
    assert task.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    # The staging's id; the relay published it as the finished task, making nothing new.
    assert str(OutboxEntry.objects.get(pk=staged.id).job_id) == first.id


@pytest.mark.parametrize(("options", "fragment"), [
    ({"unique_for": "1h"}, "needs idempotency_key"),
    ({"idempotency_key": "k", "unique_for": "soon"}, "is not a duration"),
    ({"idempotency_key": "k", "unique_for": 0}, "more than zero"),
    ({"idempotency_key": "k", "unique_for": -1}, "must not be negative"),
    # the enqueue's own rules, so a task declared fine never fails at every enqueue
    ({"idempotency_key": "k", "unique_for": 200 * 365 * 86400}, "more than 100 years"),
    ({"idempotency_key": "k", "unique_for": 0.0001}, "at least 1ms"),
])
def test_a_bad_unique_for_is_an_invalid_task_at_decoration_time(declare, options, fragment):
    with pytest.raises(InvalidTask, match=fragment):
        declare(**options)


def test_using_checks_unique_for_as_the_declaration_does():
    with pytest.raises(InvalidTask, match="needs idempotency_key"):
        t.add.using(unique_for="1h")
