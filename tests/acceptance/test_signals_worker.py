"""django_xjobs.signals in a real ``xjobs_worker`` process (docs/observability.md, "Signals").

The worker runs with the receivers of tests/testapp/receivers.py: one that raises on every
signal, connected first, then one that appends each signal it hears to a file, with the pid and
thread that heard it. The test reads that file, the rows and the worker's log.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_until

from .conftest import FAST, SETTLE, wait_started, wait_state

pytestmark = pytest.mark.acceptance


def _heard(path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _of(lines: list[dict], job_id, signal: str, key: str) -> list:
    return [line[key] for line in lines
            if line["signal"] == signal and line["job_id"] == str(job_id)]


def test_a_worker_process_sends_started_finished_and_dead_and_survives_a_raising_receiver(
        spawn_worker, tmp_path):
    from tests.testapp import jobs

    path = tmp_path / "signals.jsonl"
    flaky = jobs.flaky.enqueue(fail_times=2)  # max_attempts=5: fails twice, then succeeds
    dies = jobs.always_fails.enqueue()  # max_attempts=2
    record = jobs.record.enqueue(tag="still done")
    worker = spawn_worker("--concurrency", "2", settings=FAST,
                          env={"XJOBS_TEST_SIGNALS_FILE": str(path)})
    wait_started(worker)

    assert wait_state(flaky.id, "done").attempt == 3
    dead = wait_state(dies.id, "dead")
    assert wait_state(record.id, "done").result == {"tag": "still done", "attempt": 1}
    # job_finished follows the settle's commit: wait for the last lines, not only the rows.
    lines = wait_until(
        lambda: (found := _heard(path)) and sum(
            line["signal"] == "job_finished" for line in found) == 6 and any(
            line["signal"] == "job_dead" for line in found) and found,
        timeout=SETTLE, interval=0.05, message="every job_finished and the job_dead")

    # Heard in the worker process, by receivers after one that raised on every signal.
    assert {line["pid"] for line in lines} == {worker.pid}
    assert all(line["thread"].startswith("xjobs-exec-")
               for line in lines if line["signal"] == "job_started")

    assert _of(lines, flaky.id, "job_started", "attempt") == [1, 2, 3]
    assert _of(lines, flaky.id, "job_finished", "attempt") == [1, 2, 3]
    assert _of(lines, flaky.id, "job_finished", "outcome") == ["failed", "failed", "done"]
    assert _of(lines, flaky.id, "job_finished", "exception") == [
        "RuntimeError: flaky failure on attempt 1", "RuntimeError: flaky failure on attempt 2",
        None]
    assert set(_of(lines, flaky.id, "job_started", "sender")) == {jobs.flaky.name}

    assert _of(lines, dies.id, "job_finished", "outcome") == ["failed", "failed"]
    assert _of(lines, dies.id, "job_dead", "attempt") == [2]
    assert _of(lines, dies.id, "job_dead", "error") == [dead.last_error]
    assert "ValueError" in dead.last_error

    assert _of(lines, record.id, "job_finished", "outcome") == ["done"]
    assert [line["job_id"] for line in lines if line["signal"] == "job_dead"] == [str(dies.id)]

    # Each raise was logged, with its traceback, and changed nothing.
    log = worker.log()
    for signal in ("job_started", "job_finished", "job_dead"):
        assert f"{signal} receiver boom raised RuntimeError: a receiver that always raises" in log
    assert "Traceback (most recent call last)" in log
    assert worker.proc.poll() is None  # still running
