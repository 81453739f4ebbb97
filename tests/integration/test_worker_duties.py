"""Background duties (worker/duties.py) run beside the job loop and stop with the worker; a
worker process is handed its duties by django_xjobs/worker_process.py."""

from __future__ import annotations

import threading

import pytest

from django_xjobs import worker_process
from django_xjobs.engines import get_engine
from django_xjobs.models import Job
from django_xjobs.scheduler.runner import SchedulerDuty
from django_xjobs.worker import duties
from django_xjobs.worker.loop import Worker
from django_xjobs.worker.options import WorkerOptions
from django_xjobs.worker.relay import Relay
from django_xjobs.worker.stats import StatsDuty
from tests.conftest import wait_until
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db(transaction=True)


class Counting(duties.Duty):
    """Asks the database for the time every few milliseconds until stopped."""

    name = "counting"
    rounds = 0
    stopped = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.01):
            self.engine.db_now()
            type(self).rounds += 1
        type(self).stopped.set()


class Broken(duties.Duty):
    name = "broken"

    def run(self) -> None:
        raise RuntimeError("a bug in a duty")


@pytest.fixture(autouse=True)
def fresh_counting():
    Counting.rounds = 0
    Counting.stopped = threading.Event()


def test_the_worker_runs_its_duties_and_stops_them_when_it_stops():
    worker = Worker(WorkerOptions.from_settings(
        install_signals=False, notify=False, duties=(Counting, Broken),
    ))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: Counting.rounds >= 3, message="the duty's rounds")
        assert thread.is_alive(), "a duty that raises must not stop the worker"
    finally:
        worker.stop()
        thread.join(30)
    assert Counting.stopped.wait(10)


def test_a_worker_runs_the_duties_it_is_handed_and_a_worker_process_every_one():
    assert WorkerOptions.from_settings().duties == ()
    assert worker_process.options().duties == (Relay, SchedulerDuty, StatsDuty)
    assert worker_process.options(duties=["stats", "relay"]).duties == (StatsDuty, Relay)
    assert worker_process.options(duties=[]).duties == ()
    with pytest.raises(KeyError):
        worker_process.duty_classes(["no-such-duty"])


def test_a_worker_process_burst_runs_what_its_relay_duty_published():
    # Staged before the worker starts, relayed by its relay duty's first pass: the burst waits
    # for that pass before it decides nothing is due (worker/duties.py), then runs the job.
    staged = testapp_jobs.record.enqueue_on_commit(tag="relayed")
    worker = worker_process.run_worker(burst=True, install_signals=False, notify=False)
    assert worker.error is None
    assert Job.objects.get(id=staged.id).state == "done"
    assert worker.stats["done"] == 1


def test_start_names_the_threads_after_their_duties():
    stop = threading.Event()
    started = duties.start((Counting,), engine=get_engine(), worker_id="tests", stop=stop)
    try:
        assert [t.name for _, t in started] == ["xjobs-counting"]
    finally:
        stop.set()
        for _, t in started:
            t.join(10)
