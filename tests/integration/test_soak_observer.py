"""The soak's session check (django_xjobs/soak/observe.py) on a real session: a worker session of
the soak held in a transaction past a lease is a finding that says what tells a stalled client
from a transaction left open; another soak's session and an excused worker's are not."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from django_xjobs.soak.observe import Observer
from tests.conftest import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_session_in_a_transaction_past_a_lease_is_a_finding_that_says_how_it_stands():
    held, other, excused = (raw_connection(application_name=f"xjobs:{name}:heartbeat")
                            for name in ("soak1-w0.1", "soak2-w0.1", "soak1-w1.1"))
    try:
        for conn in (held, other, excused):
            conn.execute("select txid_current()")  # a write's xid, in an open transaction
        time.sleep(0.3)
        observer = Observer("soak1", "xjobs_soak", lease=0.2, stop=threading.Event(),
                            excused=lambda worker_id: worker_id == "soak1-w1.1")
        observer._sessions(connection.alias)
    finally:
        for conn in (held, other, excused):
            conn.close()

    [finding] = observer.seen.idle_in_transaction
    assert finding.startswith("xjobs:soak1-w0.1:heartbeat (pid ")
    assert "idle in transaction in a transaction of " in finding
    assert "last statement 'select txid_current()', begun " in finding
    assert "wrote)" in finding
