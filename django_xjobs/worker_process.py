"""A worker process, composed: the job loop (worker/loop.py) and the background duties that run
beside it (worker/duties.py has their contract).

The duties come from two layers: the outbox relay and the counters' rollup from the worker
package, the cron scheduler (with maintenance while it leads) from ``scheduler``, which sits
above the worker. So the choice is made here, above both, and handed to the worker as classes
(``WorkerOptions.duties``): the worker imports nothing from a layer above its own
(pyproject.toml, ``[tool.importlinter]``). ``manage.py xjobs_worker`` composes its worker here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .worker.duties import Duty
from .worker.loop import Worker
from .worker.options import WorkerOptions
from .worker.relay import Relay
from .worker.stats import StatsDuty


def _scheduler() -> type[Duty]:
    # Imported only by a worker that runs it: `xjobs_worker --no-scheduler` never imports the
    # scheduler.
    from .scheduler.runner import SchedulerDuty

    return SchedulerDuty


# name -> its duty's class. Order is start order; `xjobs_worker --no-NAME` switches one off.
DUTIES: dict[str, Callable[[], type[Duty]]] = {
    "relay": lambda: Relay,  # the enqueue_on_commit outbox (outbox.py)
    "scheduler": _scheduler,  # cron, and maintenance while leading
    "stats": lambda: StatsDuty,  # the counters' rollup (counters.py)
}


def duty_classes(names: Iterable[str] | None = None) -> tuple[type[Duty], ...]:
    """The duties called ``names`` (default: every one), in that order; an unknown name is a
    programming error (KeyError)."""
    return tuple(DUTIES[name]() for name in (DUTIES if names is None else names))


def options(*, duties: Iterable[str] | None = None, **overrides: object) -> WorkerOptions:
    """A worker process's options: the settings, ``overrides`` (``WorkerOptions.from_settings``)
    and the duties called ``duties`` (default: every one)."""
    return WorkerOptions.from_settings(duties=duty_classes(duties), **overrides)


def run_worker(*, duties: Iterable[str] | None = None, **overrides: object) -> Worker:
    """Build a worker process's worker (:func:`options`) and run it until it stops."""
    worker = Worker(options(duties=duties, **overrides))
    worker.run()
    return worker
