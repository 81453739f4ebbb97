"""Background duties (worker/duties.py) run beside the job loop and stop with the worker."""

from __future__ import annotations

import threading

import pytest

from django_xjobs.engines import get_engine
from django_xjobs.worker import duties
from django_xjobs.worker.loop import Worker, WorkerOptions
from tests.conftest import wait_until

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


def test_the_worker_runs_its_duties_and_stops_them_when_it_stops(monkeypatch):
    # load() resolves names under django_xjobs; point it at this module's duties instead.
    monkeypatch.setattr(duties, "load", lambda name: {"counting": Counting,
                                                      "broken": Broken}[name])
    worker = Worker(WorkerOptions.from_settings(
        install_signals=False, notify=False, duties=("counting", "broken"),
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


def test_a_worker_without_duties_starts_none(monkeypatch):
    monkeypatch.setitem(duties.AVAILABLE, "counting", "unused:Counting")
    options = WorkerOptions.from_settings(duties=())
    assert options.duties == ()
    assert WorkerOptions.from_settings().duties == tuple(duties.AVAILABLE)


def test_start_names_the_threads_after_their_duties(monkeypatch):
    monkeypatch.setattr(duties, "load", lambda name: Counting)
    stop = threading.Event()
    started = duties.start(("counting",), engine=get_engine(), worker_id="tests", stop=stop)
    try:
        assert [t.name for _, t in started] == ["xjobs-counting"]
    finally:
        stop.set()
        for _, t in started:
            t.join(10)
