"""Background duties: the work a worker process does beside running jobs.

A duty is a loop on a daemon thread with its own Django connection (threads never share one):
the outbox relay, the cron scheduler with its maintenance (leader only), and whatever else must
run somewhere in the fleet. Every worker runs every duty unless switched off
(``xjobs_worker --no-scheduler``, ``--no-relay``); each duty is also runnable alone as a
dedicated process by its own management command, which calls :meth:`Duty.run` on the main
thread.

Contract of a duty:

* :meth:`Duty.run` loops until the ``stop`` event is set, waiting on it (``stop.wait(t)``)
  rather than sleeping, so a stopping worker is never held up by a duty;
* it never raises out of :meth:`run` for a database error: it logs, resets its connection
  (``engine.reset_connection()``) and tries again on its next round, so a restarted database
  does not take the worker down;
* it closes its own connection when it returns;
* it sets :attr:`Duty.started` once the first pass of its loop is over, whether that pass
  worked or failed: a burst worker waits for it before it decides that nothing is due, since
  that pass may have enqueued jobs (the scheduler's late cron occurrences, the relay's
  stagings).

Duties are named in :data:`AVAILABLE` as ``"module:Class"`` paths relative to the package, and
imported only when started: a worker with ``--no-scheduler`` never imports the scheduler.
"""

from __future__ import annotations

import abc
import logging
import threading
from importlib import import_module

from django.db import connections

from ..engines import Engine

log = logging.getLogger("django_xjobs.worker")

# name -> "module:Class" under django_xjobs. Order is start order.
AVAILABLE: dict[str, str] = {
    "relay": "worker.relay:Relay",  # the enqueue_on_commit outbox (outbox.py)
    "scheduler": "scheduler.runner:SchedulerDuty",  # cron, and maintenance while leading
    "stats": "worker.stats:StatsDuty",  # the counters' rollup (counters.py)
}


class Duty(abc.ABC):
    """One background duty. Subclasses set :attr:`name` and implement :meth:`run`."""

    name: str = "duty"

    def __init__(self, *, engine: Engine, worker_id: str, stop: threading.Event) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.stop = stop
        self.started = threading.Event()  # the first pass of the loop is over (see above)

    @abc.abstractmethod
    def run(self) -> None:
        """Loop until :attr:`stop` is set (see the module docstring for the contract)."""

    def close_connection(self) -> None:
        try:
            connections[self.engine.alias].close()
        except Exception:  # best effort: the connection may be broken already
            log.debug("%s: closing its connection failed", self.name, exc_info=True)


def load(name: str) -> type[Duty]:
    """The duty class registered as ``name``."""
    module_path, _, cls_name = AVAILABLE[name].partition(":")
    module = import_module(f"django_xjobs.{module_path}")
    cls: type[Duty] = getattr(module, cls_name)
    return cls


def start(names: tuple[str, ...], *, engine: Engine, worker_id: str,
          stop: threading.Event) -> list[tuple[Duty, threading.Thread]]:
    """Start each named duty on its own daemon thread; unknown names are a programming error."""
    started: list[tuple[Duty, threading.Thread]] = []
    for name in names:
        duty = load(name)(engine=engine, worker_id=worker_id, stop=stop)
        thread = threading.Thread(target=_run_logged, args=(duty,), name=f"xjobs-{name}",
                                  daemon=True)
        thread.start()
        started.append((duty, thread))
    return started


def _run_logged(duty: Duty) -> None:
    try:
        duty.run()
    except Exception:  # a duty's bug must not pass silently, nor take the worker down
        log.exception("background duty %s stopped with an error", duty.name)
    finally:
        duty.started.set()  # a duty that ended has nothing more to enqueue
        duty.close_connection()
