"""Worker recycling without a database (worker/recycling.py): the memory sizes it reads, what
counts as a job, when a process leaves, how much it may still claim. The real processes:
tests/acceptance/test_worker_recycling.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from django_xjobs import conf
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.values import parse_mebibytes
from django_xjobs.worker.capacity import Capacity
from django_xjobs.worker.executor import (
    Discard,
    Done,
    GiveBack,
    KeyPaused,
    Retry,
    Suspended,
    UnknownName,
)
from django_xjobs.worker.liveness import Liveness
from django_xjobs.worker.options import WorkerOptions
from django_xjobs.worker.recycling import MIB, Recycling, resident_bytes
from django_xjobs.worker.runs import FINISHED, SETTLED, Runs

# ------------------------------------------------------------------------- memory sizes --


@pytest.mark.parametrize(("value", "mib"), [
    (512, 512), ("512", 512), ("512MiB", 512), (" 512 mib ", 512), ("1GiB", 1024),
    ("1.5GiB", 1536), ("0.5gib", 512), ("1", 1),
])
def test_a_memory_size_is_whole_mebibytes(value, mib):
    assert parse_mebibytes(value) == mib


@pytest.mark.parametrize("value", [
    0, "0", -1, "-512", "0.4", "512MB", "1GB", "1G", "512KiB", "lots", "", True, 512.0, None,
])
def test_a_memory_size_refuses_what_is_not_at_least_one_mebibyte(value):
    with pytest.raises(ConfigurationError, match="what"):
        parse_mebibytes(value, what="what")


def test_the_settings_take_the_bounds_and_default_to_none():
    assert (conf.build({}).max_jobs_per_process, conf.build({}).max_memory) == (None, None)
    s = conf.build({"MAX_JOBS_PER_PROCESS": 1000, "MAX_MEMORY": "1GiB"})
    assert (s.max_jobs_per_process, s.max_memory) == (1000, 1024)


def test_an_in_process_worker_never_recycles():
    # testing.drain builds its worker from the settings: the bounds are the command's to hand.
    from django.test import override_settings

    with override_settings(XJOBS={"MAX_JOBS_PER_PROCESS": 3, "MAX_MEMORY": 512}):
        options = WorkerOptions.from_settings()
    assert (options.max_jobs_per_process, options.max_memory) == (None, None)


# ---------------------------------------------------------------------- what counts --


def _settled(outcome, phase=SETTLED):
    """What Recycling.settled reads of a run: its phase after the settle, its outcome."""
    return SimpleNamespace(phase=phase, outcome=outcome)


ran_here = [
    Done(result_json=None),
    Retry(error="boom", delay=1.0),
    Retry(error="timeout", delay=1.0, outcome="timeout"),
    Retry(error="for good", delay=0.0, permanent=True),
    GiveBack(delay=60.0, outcome="snoozed"),
    KeyPaused(key="k", seconds=1.0, reason=None),
    Suspended(wake_at=datetime.now(UTC)),
    Discard(reason="cancelled"),
]


def test_every_settled_run_whose_code_it_had_counts_whatever_its_outcome():
    recycling = Recycling(max_jobs=100, max_memory=None)
    assert recycling.settled([_settled(o) for o in ran_here]) is None
    assert recycling.jobs == len(ran_here)


def test_a_name_it_does_not_know_and_a_settle_set_aside_do_not_count():
    recycling = Recycling(max_jobs=1, max_memory=None)
    unknown = UnknownName(note="UnknownJob", max_delay=60.0)
    assert recycling.settled([_settled(unknown), _settled(Done(None), phase=FINISHED)]) is None
    assert recycling.jobs == 0
    # The set-aside run counts once a later settle writes it.
    assert recycling.settled([_settled(Done(None))]) == "recycling after 1 jobs"


def test_it_leaves_once_it_counted_max_jobs():
    recycling = Recycling(max_jobs=3, max_memory=None)
    assert recycling.settled([_settled(Done(None))] * 2) is None
    assert recycling.jobs_left == 1
    assert recycling.settled([_settled(Done(None))]) == "recycling after 3 jobs"


# --------------------------------------------------------------------------- memory --


def test_the_resident_memory_is_read_now():
    rss = resident_bytes()
    assert rss is not None and rss > MIB
    hoard = b"x" * (64 * MIB)  # written: resident at once
    assert resident_bytes() >= rss + 60 * MIB
    del hoard


def test_it_leaves_once_a_settle_finds_it_over_its_memory_bound():
    recycling = Recycling(max_jobs=None, max_memory=1)
    assert recycling.settled([]) is None  # nothing settled: not even read
    reason = recycling.settled([_settled(Done(None))])
    assert reason is not None and reason.startswith("recycling: RSS ")
    assert reason.endswith(" MiB over --max-memory 1")
    assert Recycling(max_jobs=None, max_memory=10**6).settled([_settled(Done(None))]) is None


def test_a_process_over_its_bound_at_start_up_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="django_xjobs.worker"):
        Recycling(max_jobs=None, max_memory=1).starting("w1")
        Recycling(max_jobs=None, max_memory=10**6).starting("w2")
    assert "worker w1: RSS" in caplog.text and "replaced after every job" in caplog.text
    assert "w2" not in caplog.text


# ------------------------------------------------------------------------ the budget --


def test_a_process_claims_no_more_than_it_may_still_count():
    options = WorkerOptions(queues=("default",), concurrency=10, prefetch=5, lease=30.0,
                            heartbeat=10.0, poll_interval=1.0, shutdown_grace=30.0)
    runs = Runs(flow=None, liveness=Liveness())  # the flow is only asked when a run finishes
    assert Capacity(options, runs).free() == 15
    assert Capacity(options, runs, Recycling(max_jobs=None, max_memory=512)).free() == 15
    recycling = Recycling(max_jobs=4, max_memory=None)
    capacity = Capacity(options, runs, recycling)
    assert (capacity.free(), capacity.budget_room()) == (4, 4)
    recycling.settled([_settled(Done(None))] * 3)
    assert (capacity.free(), capacity.budget_room()) == (1, 1)
