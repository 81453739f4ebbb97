"""``manage.py xjobs check-deploy``: the deploy check's part of the ``xjobs`` command
(docs/durable.md, "The deploy check").

    manage.py xjobs check-deploy [--job NAME] [--limit N] [--json]

Replays every suspended durable run against the code now installed (``deploycheck.check``) and
lists the runs whose code would take a different path. Exit code 1 when any would (a deploy
gate: ``manage.py xjobs check-deploy && deploy``), 0 when none would; a bad argument ends it
with exit code 2, before anything is read (docs/reference/commands.md, "Exit status").
"""

from __future__ import annotations

from typing import Any

from .. import deploycheck
from . import cli

ACTIONS = ("check-deploy",)


def add_arguments(sub: Any) -> list[Any]:
    """Add the subcommand; return the parsers that take ``--json``."""
    parser = sub.add_parser(
        "check-deploy",
        help="replay the suspended durable runs against this code; exit 1 if any would diverge")
    parser.add_argument("--job", metavar="NAME", help="only the runs of this job")
    parser.add_argument("--limit", type=int, default=None,
                        help="check at most this many runs (default: all)")
    return [parser]


def handle(command: Any, options: dict[str, Any], as_json: bool) -> None:
    limit = options["limit"]
    if limit is not None and limit < 1:
        raise cli.usage_error("--limit must be at least 1")
    verdicts = deploycheck.check(name=options["job"], limit=limit)
    diverging = [v for v in verdicts if v.diverges]
    if as_json:
        cli.emit(command, {"checked": len(verdicts), "diverging": len(diverging),
                           "runs": [cli.record_dict(v) for v in verdicts]})
    else:
        _report(command, verdicts, diverging, int(options.get("verbosity", 1)))
    if diverging:
        # After the report: the exit code is the gate, the report says why.
        raise SystemExit(cli.FAILED)


def _report(command: Any, verdicts: list[deploycheck.Verdict],
            diverging: list[deploycheck.Verdict], verbosity: int) -> None:
    if not verdicts:
        command.stdout.write("check-deploy: no suspended durable run to check")
        return
    command.stdout.write(
        f"check-deploy: {len(verdicts)} suspended durable run(s) replayed against the code now "
        f"installed; {len(diverging) or 'none'} would take a different path")
    for v in verdicts:
        if v.diverges:
            command.stdout.write(f"  DIVERGES  job {v.job_id} ({v.name}): {v.reason}")
        elif verbosity >= 2:
            command.stdout.write(f"  ok        job {v.job_id} ({v.name}): {v.recorded} recorded "
                                 "step(s) reached in order")
