"""Which PostgreSQL the demo, the test suite and bench/ use, with no set-up on a fresh machine.

In order: ``DATABASE_URL`` if set; else a server answering on ``127.0.0.1:5432`` (user
``postgres``); else (or with ``XJOBS_DEVDB=embedded``) an embedded PostgreSQL 16 from the
``pgserver`` wheel
(``pip install django-xjobs[embedded]``), with its data under ``.pgdata/`` of the checkout and a
unix socket, stopped when the process that started it exits.

    python -m tests.devdb    # print the URL (starting the embedded server if needed)

A tool of the checkout, not of the package: it is not in the wheel, and production settings
configure ``DATABASES`` as usual. Its users put the checkout's root on ``sys.path``:
``example_project/manage.py`` does, pytest does for ``tests/settings.py`` (``tests`` is a package
at the root), the scripts of ``bench/`` do, and so does ``bench/xjobs_adapter.py`` for the
workers of the shared harness.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

LOCAL_URL = "postgres://postgres@127.0.0.1:5432/postgres"
ENV_SOURCE = "XJOBS_DATABASE_SOURCE"  # set by resolve() for child processes and messages


def _answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _embedded_url(data_dir: Path) -> str:
    import warnings

    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers): harmless here.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import pgserver  # type: ignore[import-not-found]
    except ImportError:
        raise RuntimeError(
            "No PostgreSQL: DATABASE_URL is not set, nothing answers on 127.0.0.1:5432, and the "
            "embedded server is not installed (pip install 'django-xjobs[embedded]')."
        ) from None
    data_dir.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        server = pgserver.get_server(str(data_dir), cleanup_mode="stop")
    _keep.append(server)
    return str(server.get_uri())


_keep: list[Any] = []


def resolve(data_dir: Path | None = None) -> tuple[str, str]:
    """Return ``(url, source)`` where source says which of the three was used."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url, os.environ.get(ENV_SOURCE, "DATABASE_URL")
    if os.environ.get("XJOBS_DEVDB") != "embedded" and _answers("127.0.0.1", 5432):
        return LOCAL_URL, "local server on 127.0.0.1:5432"
    data_dir = data_dir or Path(__file__).resolve().parents[1] / ".pgdata"  # the checkout's
    return _embedded_url(data_dir), f"embedded PostgreSQL (pgserver) in {data_dir}"


def with_database(url: str, name: str) -> str:
    """``url`` with its database name replaced by ``name``."""
    parts = urlsplit(url)
    return parts._replace(path=f"/{name}").geturl()


def settings_from_url(url: str, **extra: Any) -> dict[str, Any]:
    """A ``DATABASES`` entry from ``postgres://user:pass@host:port/name?opt=val``.

    libpq parses it (psycopg's ``conninfo_to_dict``), so it means what it means to psql and to
    the connection Django opens with it: percent-encoded parts, a ``host`` query parameter (a
    socket directory, as pgserver's URIs use) over the host, IPv6 hosts, lists of hosts. The
    other query parameters become ``OPTIONS``, where libpq refuses one it does not know; no
    database name is the server's ``postgres``.
    """
    if urlsplit(url).scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, got {url!r}")
    params = conninfo_to_dict(url)
    entry: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname", None) or "postgres",
        "USER": params.pop("user", None) or "",
        "PASSWORD": params.pop("password", None) or "",
        "HOST": params.pop("host", None) or "",
        "PORT": params.pop("port", None) or "",
        "OPTIONS": params,
    }
    entry.update(extra)
    return entry


def ensure_database(entry: dict[str, Any]) -> bool:
    """Create the database a ``DATABASES`` entry names if it does not exist; True if created."""
    params: dict[str, Any] = {
        "dbname": "postgres",
        "user": entry.get("USER") or None,
        "password": entry.get("PASSWORD") or None,
        "host": entry.get("HOST") or None,
        "port": entry.get("PORT") or None,
    }
    with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as conn:
        exists = conn.execute(
            "select 1 from pg_database where datname = %s", (entry["NAME"],)
        ).fetchone()
        if exists:
            return False
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(entry["NAME"])))
        return True


if __name__ == "__main__":
    resolved_url, source = resolve()
    print(resolved_url)
    print(f"database: {source}", file=sys.stderr)
