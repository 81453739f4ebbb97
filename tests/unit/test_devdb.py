"""The checkout's database helper (the demo, the suite and bench/ configure their database
through it): the ``DATABASES`` entry it makes of each URL form they meet, and the order in which
it picks a server. No server is reached here."""

from __future__ import annotations

import psycopg
import pytest

from tests import devdb

POSTGRES = "django.db.backends.postgresql"


def entry(name: str, user: str = "", password: str = "", host: str = "", port: str = "",
          **options: str) -> dict:
    return {"ENGINE": POSTGRES, "NAME": name, "USER": user, "PASSWORD": password, "HOST": host,
            "PORT": port, "OPTIONS": options}


@pytest.mark.parametrize(("url", "expected"), [
    # The server on 127.0.0.1:5432 (devdb.LOCAL_URL).
    ("postgres://postgres@127.0.0.1:5432/postgres",
     entry("postgres", "postgres", host="127.0.0.1", port="5432")),
    # The embedded server's URI: a unix socket directory in the query, an empty password.
    ("postgresql://postgres:@/postgres?host=/checkout/.pgdata",
     entry("postgres", "postgres", host="/checkout/.pgdata")),
    # A DATABASE_URL: percent-encoded parts are decoded, query parameters become OPTIONS.
    ("postgres://us%40er:p%40ss%3Aw@db.example.com:6543/my%20db?sslmode=require"
     "&connect_timeout=10",
     entry("my db", "us@er", "p@ss:w", "db.example.com", "6543", sslmode="require",
           connect_timeout="10")),
    # No database name: the server's default database.
    ("postgres://u@h", entry("postgres", "u", host="h")),
    ("postgres://u@h/", entry("postgres", "u", host="h")),
    # A socket directory, in the query or percent-encoded as the host.
    ("postgresql:///xjobs?host=%2Ftmp%2Fsock", entry("xjobs", host="/tmp/sock")),
    ("postgresql://%2Ftmp%2Fsock/xjobs", entry("xjobs", host="/tmp/sock")),
    ("postgres://[::1]:5432/x", entry("x", host="::1", port="5432")),
    # Several hosts, tried in turn by libpq (a primary and its standby).
    ("postgres://h1:5432,h2:5433/x", entry("x", host="h1,h2", port="5432,5433")),
])
def test_a_url_becomes_a_databases_entry(url, expected):
    assert devdb.settings_from_url(url) == expected


def test_extra_keys_are_added_to_the_entry():
    made = devdb.settings_from_url("postgres://u@h/x", CONN_MAX_AGE=0)
    assert made == {**entry("x", "u", host="h"), "CONN_MAX_AGE": 0}


@pytest.mark.parametrize("url", ["mysql://u@h/x", "sqlite:///x.db", "h/x"])
def test_only_a_postgres_url_is_accepted(url):
    with pytest.raises(ValueError, match="postgres:// URL"):
        devdb.settings_from_url(url)


def test_a_query_parameter_libpq_does_not_know_is_refused_at_once():
    # Not carried into OPTIONS to fail later, at the first connection.
    with pytest.raises(psycopg.ProgrammingError, match="sslmdoe"):
        devdb.settings_from_url("postgres://u@h/x?sslmdoe=require")


@pytest.mark.parametrize(("url", "expected"), [
    ("postgres://postgres@127.0.0.1:5432/postgres", "postgres://postgres@127.0.0.1:5432/demo"),
    ("postgresql://postgres:@/postgres?host=/checkout/.pgdata",
     "postgresql://postgres:@/demo?host=/checkout/.pgdata"),
    ("postgres://u@h", "postgres://u@h/demo"),
])
def test_with_database_replaces_only_the_database_name(url, expected):
    assert devdb.with_database(url, "demo") == expected


def test_database_url_comes_first_and_names_its_source(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://u@h/x")
    monkeypatch.delenv(devdb.ENV_SOURCE, raising=False)
    assert devdb.resolve() == ("postgres://u@h/x", "DATABASE_URL")
    # A child process started by the demo or the suite says which server its parent picked.
    monkeypatch.setenv(devdb.ENV_SOURCE, "local server on 127.0.0.1:5432")
    assert devdb.resolve() == ("postgres://u@h/x", "local server on 127.0.0.1:5432")
