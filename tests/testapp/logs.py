"""A worker's log as JSON lines, for the tests that read its levels and attributes
(``XJOBS_TEST_LOG_JSON``, tests/settings.py; docs/observability.md, "Logs")."""

from __future__ import annotations

import json
import logging
from typing import Any

JOB_ATTRIBUTES = ("job_id", "job_name", "attempt")


class JSONLines(logging.Formatter):
    """Level, logger, thread, message, and the job's attributes when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"level": record.levelname, "logger": record.name,
                                "thread": record.threadName, "message": record.getMessage()}
        for key in JOB_ATTRIBUTES:
            if hasattr(record, key):
                line[key] = getattr(record, key)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def records(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a worker's log (whatever else it printed is skipped)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:  # a line cut by a write still under way
                continue
    return found
