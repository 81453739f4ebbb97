"""Django signals of a job's life, sent in the process where the event happens
(docs/observability.md, "Signals").

=================  ===========================================  ================================
signal             keyword arguments                            sent
=================  ===========================================  ================================
``job_enqueued``   ``handle``                                   by the process whose insert made
                                                                the job, once per new job
``job_started``    ``job``, ``attempt``                         by the worker, right before the
                                                                job's body runs
``job_finished``   ``job``, ``attempt``, ``outcome``,           by the worker, once per claim,
                   ``exception``                                after its outcome was written
``job_dead``       ``job``, ``error``                           by the worker, when that write
                                                                made the job ``dead``
=================  ===========================================  ================================

``sender`` is the job: what ``@job`` returned (its ``JobDefinition``), so
``job_finished.connect(receiver, sender=send_welcome)`` hears one job only; the stored name
(a ``str``) when no job of that name is registered in the sending process. ``job`` is the
claimed row (``records.ClaimedJob``: ``id``, ``name``, ``queue``, ``tenant_id``, ...).
``outcome`` is the word the run's entry in the job's attempt history has
(``records.ATTEMPT_OUTCOMES``).

Every send goes through :func:`send` (or :func:`asend` on an event loop): ``send_robust``, so a
receiver that raises is logged on ``django_xjobs.signals`` with its traceback and never breaks
an enqueue or a worker. Callers test ``signal.receivers`` first and build nothing when nobody
listens: a worker settles tens of thousands of runs a second, and an unheard signal must cost
it one attribute read.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

log = logging.getLogger("django_xjobs.signals")

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()
job_dead = Signal()

_NAMES = {id(job_enqueued): "job_enqueued", id(job_started): "job_started",
          id(job_finished): "job_finished", id(job_dead): "job_dead"}


def send(signal: Signal, sender: Any, **named: Any) -> None:
    """Send ``signal`` to every receiver; log each one that raised, then carry on."""
    _log_failures(signal, signal.send_robust(sender, **named))


async def asend(signal: Signal, sender: Any, **named: Any) -> None:
    """:func:`send` from a coroutine: ``send_robust`` cannot run an async receiver on a thread
    whose event loop is running, ``asend_robust`` can (and runs sync ones in a thread)."""
    _log_failures(signal, await signal.asend_robust(sender, **named))


def _log_failures(signal: Signal, responses: list[tuple[Any, Any]]) -> None:
    for receiver, response in responses:
        if isinstance(response, Exception):
            log.error("%s receiver %s raised %s: %s (ignored)",
                      _NAMES.get(id(signal), "signal"),
                      getattr(receiver, "__qualname__", receiver), type(response).__name__,
                      response, exc_info=response)
