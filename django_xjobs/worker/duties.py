"""Background duties: the work a worker process does beside running jobs.

A duty is a loop on a daemon thread with its own Django connection (threads never share one):
the outbox relay, the cron scheduler with its maintenance (leader only), and whatever else must
run somewhere in the fleet. Every worker process of ``manage.py xjobs_worker`` runs every duty
unless switched off (``--no-scheduler``, ``--no-relay``, ``--no-stats``); each duty is also
runnable alone as a dedicated process by its own management command, which calls
:meth:`Duty.run` on the main thread.

Which duties a worker runs is not decided here: the cron scheduler sits in a layer above the
worker (pyproject.toml, ``[tool.importlinter]``), so a worker process is composed above both
(django_xjobs/worker_process.py), which hands the worker the duty classes to start
(``WorkerOptions.duties``). A worker handed none runs none.

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
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Iterable

from django.db import connections

from ..engines import Engine

log = logging.getLogger("django_xjobs.worker")


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


def start(duties: Iterable[type[Duty]], *, engine: Engine, worker_id: str,
          stop: threading.Event) -> list[tuple[Duty, threading.Thread]]:
    """Start each duty, in order, on a daemon thread of its own named after it."""
    started: list[tuple[Duty, threading.Thread]] = []
    for cls in duties:
        duty = cls(engine=engine, worker_id=worker_id, stop=stop)
        thread = threading.Thread(target=_run_logged, args=(duty,), name=f"xjobs-{duty.name}",
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
