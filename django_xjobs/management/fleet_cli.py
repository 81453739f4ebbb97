"""``manage.py xjobs fleet``: old and new versions side by side (docs/deployment.md, "Mixed
versions").

    manage.py xjobs fleet                          the fleet's compatibility, what this version
                                                   holds back, the versions of the workers seen
    manage.py xjobs fleet --finish-upgrade         no process of an older release runs any more:
                                                   write everything this version writes
    manage.py xjobs fleet --compatible-with 0.1    before a rollback to 0.1: write only what it
                                                   reads

``--finish-upgrade`` refuses while a worker of an older version was seen lately (x_workers),
unless ``--force``: a worker of 0.1 writes no such row, so stopping every 0.1 process (web,
workers, relays, schedulers) before it is the operator's part.
"""

from __future__ import annotations

import getpass
import socket
from typing import Any

from django.core.management.base import CommandError

from .. import conf, versions
from ..console.reads.text import db_now
from ..engines import get_engine
from ..records import FleetRecord, WorkerRecord
from . import cli

ACTIONS = ("fleet",)

# A worker whose last heartbeat is older than this is not counted as running.
SEEN_LATELY = 300.0


def add_arguments(sub: Any) -> list[Any]:
    """Add the subcommand; return the parsers that take ``--json``."""
    parser = sub.add_parser("fleet", help="old and new versions side by side: the fleet's "
                                          "compatibility, --finish-upgrade, --compatible-with")
    change = parser.add_mutually_exclusive_group()
    change.add_argument("--finish-upgrade", action="store_true",
                        help="every process runs this version (or newer): stop holding back")
    change.add_argument("--compatible-with", metavar="SERIES",
                        help="hold back what release SERIES (e.g. 0.1) cannot read, before a "
                             "rollback to it")
    parser.add_argument("--force", action="store_true",
                        help="--finish-upgrade even though a worker of an older version was "
                             "seen lately")
    return [parser]


def handle(command: Any, options: dict[str, Any], as_json: bool) -> None:
    engine = get_engine()
    by = f"manage.py xjobs fleet by {getpass.getuser()}@{socket.gethostname()}"
    now = db_now()
    seen = [w for w in engine.workers_list(max_stall=SEEN_LATELY)
            if (now - w.seen_at).total_seconds() <= SEEN_LATELY]
    older = [w for w in seen if versions.older(w.version)]
    if options["finish_upgrade"]:
        if older and not options["force"]:
            names = ", ".join(f"{w.id} ({w.version or 'no version'})" for w in older)
            raise CommandError(
                f"{len(older)} worker(s) of an older version seen in the last "
                f"{cli.duration(SEEN_LATELY)}: {names}. Stop them first (or pass --force if "
                "they are gone for good); nothing was changed.")
        record = engine.fleet_set(compatible_with=None, changed_by=by)
    elif options["compatible_with"] is not None:
        try:
            series = versions.parse_series(options["compatible_with"])
        except ValueError as exc:
            raise cli.usage_error(f"--compatible-with: {exc}; nothing was changed") from None
        record = engine.fleet_set(compatible_with=series, changed_by=by)
    else:
        record = engine.fleet_get()
    _show(command, record, seen, as_json)


def _show(command: Any, record: FleetRecord, seen: list[WorkerRecord], as_json: bool) -> None:
    held = versions.held_back(record)
    by_version: dict[str, int] = {}
    for w in seen:
        by_version[w.version or "?"] = by_version.get(w.version or "?", 0) + 1
    if as_json:
        cli.emit(command, {"version": conf.VERSION, "series": versions.SERIES,
                           "compatible_with": record.compatible_with,
                           "changed_at": record.changed_at, "changed_by": record.changed_by,
                           "held_back": held, "workers_by_version": by_version})
        return
    out = command.stdout
    out.write(f"this version: {conf.VERSION}")
    if record.compatible_with is None:
        out.write("compatibility: none needed (every process runs this version or a newer "
                  "one); nothing is held back")
    else:
        out.write(f"compatibility: kept compatible with {record.compatible_with} (set "
                  f"{record.changed_at:%Y-%m-%d %H:%M:%S %Z} by {record.changed_by})")
        out.write("held back until `manage.py xjobs fleet --finish-upgrade`:")
        for line in held:
            out.write(f"  - {line}")
    workers = ", ".join(f"{v} x{n}" for v, n in sorted(by_version.items())) or "none"
    out.write(f"workers seen in the last {cli.duration(SEEN_LATELY)}: {workers} (0.1 workers "
              "report no row: check your deploy for them)")
