"""The maintenance thread's loop (django_xjobs/scheduler/runner.py, Maintenance.run) waits
between its turns: a process that does not lead, and a turn that failed, wait a whole tick.
Once its first interval was over, its wait "until the next full run" was no wait at all, and
every worker that did not lead spun a core on it for as long as it ran.

The stop event is a recorder: each wait returns at once and notes the timeout it was given."""

from __future__ import annotations

from types import SimpleNamespace

from django_xjobs.scheduler.runner import ARCHIVE_TICK, Maintenance


class Recorder:
    """A stop event that records every wait's timeout and stops the loop after ``n``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.waits: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return len(self.waits) >= self.n


def run(leader: bool, engine: SimpleNamespace) -> list[float]:
    stop = Recorder(20)
    Maintenance(engine=engine, leadership=SimpleNamespace(is_leader=lambda: leader),
                interval=0.0, stop=stop).run()  # type: ignore[arg-type]
    return stop.waits


def test_a_process_that_does_not_lead_waits_a_tick_between_looks():
    waits = run(False, SimpleNamespace(alias="default"))

    assert waits[1:] == [ARCHIVE_TICK] * 19


def test_a_turn_that_failed_waits_a_tick_before_the_next_try():
    def refuse(label: str) -> None:
        raise RuntimeError("the database refuses")

    engine = SimpleNamespace(alias="default", session_label=refuse,
                             is_connection_error=lambda exc: False)

    waits = run(True, engine)

    assert waits[1:] == [ARCHIVE_TICK] * 19
