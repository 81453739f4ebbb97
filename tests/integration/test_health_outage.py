"""``manage.py xjobs health`` when it cannot open a connection to the database
(docs/observability.md, "Workers and health probes"): run as a probe runs it, in a process of
its own, with ``DATABASE_URL`` pointing where no connection can be had. An unreachable database
(a closed port, a host name that does not resolve, a server that never answers) is one line on
stderr and exit status 3, never a traceback; a server that turns the connection away (a role
that does not exist) is exit status 1, also one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from django_xjobs.management.workers_cli import DATABASE_UNREACHABLE, UNHEALTHY
from tests.conftest import ROOT

UNREACHABLE_LINE = "CommandError: database unreachable (alias 'default'): "
REFUSED_LINE = "CommandError: database refused the connection (alias 'default'): "


def health_at(url: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m django xjobs health`` on the tests' settings with ``DATABASE_URL=url``."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "DATABASE_URL": url}
    for name in ("XJOBS_TEST_DB_NAME", "XJOBS_TEST_JOBS_DB_NAME", "XJOBS_TEST_SETTINGS"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "django", "xjobs", "health", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def one_line(done: subprocess.CompletedProcess) -> str:
    """The whole of stderr, which must be one line (no traceback), and nothing on stdout."""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and done.stdout == "", done.stdout + done.stderr
    return lines[0]


@pytest.fixture
def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on: a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never says a word: a
    server that hangs, or a network that loses the answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_a_refused_connection_is_one_line_and_exit_status_3(closed_port):
    done = health_at(f"postgres://postgres@127.0.0.1:{closed_port}/x")
    assert done.returncode == DATABASE_UNREACHABLE == 3
    line = one_line(done)
    assert line.startswith(UNREACHABLE_LINE), line
    assert f'"127.0.0.1", port {closed_port} failed: Connection refused' in line


def test_json_says_the_database_is_unreachable(closed_port):
    done = health_at(f"postgres://postgres@127.0.0.1:{closed_port}/x", "--json",
                     "--queue", "default", "--max-stall", "2m")
    assert done.returncode == DATABASE_UNREACHABLE
    data = json.loads(done.stdout)
    assert data["overall"] == "unreachable"
    probe = data["probe"]
    assert (probe["status"], probe["healthy"], probe["database"], probe["max_stall_seconds"]) \
        == ("database_unreachable", False, "default", 120.0)
    assert "Connection refused" in probe["reason"] and "\n" not in probe["reason"]
    # The same one line on stderr as without --json, and as the one reason.
    assert done.stderr.splitlines() == [UNREACHABLE_LINE + probe["reason"]], done.stderr
    assert probe["reasons"] == [UNREACHABLE_LINE.removeprefix("CommandError: ")
                                + probe["reason"]]


def test_a_host_name_that_does_not_resolve_is_unreachable():
    # .invalid never resolves (RFC 2606), with or without a network.
    done = health_at("postgres://postgres@xjobs-health.invalid:5432/x")
    assert done.returncode == DATABASE_UNREACHABLE
    line = one_line(done)
    assert line.startswith(UNREACHABLE_LINE) and "xjobs-health.invalid" in line, line


def test_a_server_that_never_answers_is_unreachable_after_connect_timeout(silent_server):
    done = health_at(f"postgres://postgres@127.0.0.1:{silent_server}/x?connect_timeout=2")
    assert done.returncode == DATABASE_UNREACHABLE
    line = one_line(done)
    assert line == UNREACHABLE_LINE + "connection timeout expired", line


def test_a_server_that_turns_the_connection_away_is_unhealthy_not_unreachable():
    """The server answers: no outage, a setting to fix (here a role that does not exist; a
    wrong password reads the same), so exit status 1 and the line says which."""
    from django.db import connection

    params = connection.settings_dict
    query = f"host={quote(params['HOST'] or '')}&port={params['PORT'] or 5432}"
    done = health_at(f"postgresql://xjobs_no_such_role@/{params['NAME']}?{query}")
    assert done.returncode == UNHEALTHY
    line = one_line(done)
    assert line.startswith(REFUSED_LINE) and "xjobs_no_such_role" in line, line
