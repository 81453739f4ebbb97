"""What the ``xjobs*`` management commands share: JSON output (``--json``), the translation of
the package's errors into ``CommandError``, and log lines on stderr for the commands that run
until they are stopped (worker, relay, scheduler)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.core.management.base import CommandError

from ..exceptions import LiveJobExists, XJobsError


def jsonable(value: Any) -> Any:
    """A datetime, date, time, UUID or Decimal (a job's input and result may hold them) as JSON
    text, a record (a dataclass: an attempt, the progress) as the dict of its fields; any other
    value as it is."""
    if isinstance(value, date | time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, UUID | Decimal):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_dict(value)
    return value


def duration(seconds: float) -> str:
    """A span of time as an operator reads it: ``45s``, ``3m20s``, ``2h05m``."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def record_dict(record: Any) -> dict[str, Any]:
    """A record (a dataclass) as a JSON-ready dict of its fields."""
    return {name: jsonable(getattr(record, name)) for name in record.__dataclass_fields__}


def emit(command: Any, data: Any) -> None:
    """Write ``data`` to the command's stdout as indented JSON."""
    command.stdout.write(json.dumps(data, indent=2, default=jsonable))


def add_json_flag(parser: Any) -> None:
    """``--json`` on a subcommand, beside the command's own."""
    # SUPPRESS: an absent sub-level flag must not reset `xjobs --json show ID`.
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output")


@contextmanager
def command_errors() -> Iterator[None]:
    """The package's errors end the command with their message (exit code 1, no traceback);
    a live job in the way names the command that shows it."""
    try:
        yield
    except LiveJobExists as exc:
        raise CommandError(f"{exc} (see: manage.py xjobs show {exc.live_job_id})") from None
    except XJobsError as exc:
        raise CommandError(str(exc)) from None


def log_to_stderr(verbosity: int) -> None:
    """Send django-xjobs' log lines to stderr (DEBUG from ``-v 3``), unless ``-v 0`` or the
    project's logging configuration already handles them."""
    logger = logging.getLogger("django_xjobs")
    if verbosity < 1 or logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity >= 3 else logging.INFO)
