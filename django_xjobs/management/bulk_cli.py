"""``manage.py xjobs retry|cancel|delete --filter ...``: the console's actions over a filter
from a terminal (docs/console.md, "Acting on thousands").

    manage.py xjobs retry --filter state=dead --filter "error=card declined"
    manage.py xjobs retry --filter 'state=dead&queue=payments' --yes

A ``--filter`` is one ``name=value`` with the console's names (``state``, ``queue``, ``name``,
``tenant``, ``worker``, ``error``, ``q``), taken as written, or several joined by ``&``: what
follows the ``?`` of a jobs list's address, decoded as such (``+`` is a space); several
``--filter`` are combined. Without ``--yes`` the command counts the jobs the
action would change and stops there (exit 0); with it, it runs the action a batch per
statement (:mod:`django_xjobs.console.bulk`) and says what it did.
"""

from __future__ import annotations

import getpass
from typing import Any

from django.http import QueryDict

from ..api import acting_as
from ..console import bulk
from ..console.reads.search import FILTERS, filtered_jobs
from . import cli

# The subcommand of each action, and the action's name in console/bulk.py.
ACTIONS = {"retry": "retry", "cancel": "cancel", "delete": "delete"}


def add_filter_arguments(parser: Any) -> None:
    """``--filter`` and ``--yes`` on a subcommand that also takes job ids."""
    parser.add_argument(
        "--filter", action="append", metavar="QUERY",
        help="instead of ids: every job this filter matches, in the console's names "
             f"({', '.join(FILTERS)}); a query string such as 'state=dead&queue=payments', "
             "repeatable")
    parser.add_argument("--yes", action="store_true",
                        help="with --filter: act (without it, only count the jobs)")


def wants_filter(options: dict[str, Any]) -> bool:
    """Whether the command names a filter rather than job ids; both, or a ``--yes`` without a
    filter, is bad usage."""
    given = options.get("filter")
    ids = options.get("job_id") or options.get("job_ids")
    if given and ids:
        raise cli.usage_error("give job ids or --filter, not both")
    if options.get("yes") and not given:
        raise cli.usage_error("--yes goes with --filter")
    if not given and not ids:
        raise cli.usage_error("give a job id, or --filter QUERY for every job a filter "
                              "matches")
    return bool(given)


def handle(command: Any, action: str, options: dict[str, Any], as_json: bool) -> None:
    filters: dict[str, str] = {}
    for query in options["filter"]:
        # One name=value is taken as it is (q=ada+x@example.com is that address); several,
        # joined by "&", as the query string of a list's address, decoded.
        pairs = (QueryDict(query.lstrip("?")).lists() if "&" in query
                 else [(query.partition("=")[0], [query.partition("=")[2]])])
        for key, values in pairs:
            for value in values:
                if key in filters and filters[key] != value:
                    raise cli.usage_error(f"--filter gives {key} twice: {filters[key]!r} and "
                                          f"{value!r}")
                filters[key] = value
    if not any(v.strip() for v in filters.values()):
        raise cli.usage_error("--filter names no filter: give at least one of "
                              f"{', '.join(FILTERS)} (state=dead, for all dead jobs)")
    queryset, _searched = filtered_jobs(filters)
    name = ACTIONS[action]
    matched = bulk.count(queryset, name)
    if matched > bulk.LIMIT:
        raise cli.usage_error(f"more than {bulk.LIMIT:,} jobs match: an action over a filter "
                              "takes at most that many; narrow the filter")
    states = "/".join(bulk.BULK_ACTIONS[name].states)
    if not options["yes"]:
        if as_json:
            cli.emit(command, {"action": action, "filters": filters, "matched": matched,
                               "done": False})
        else:
            command.stdout.write(f"{matched} {states} job(s) match; run again with --yes to "
                                 f"{action} them")
        return
    who = operator()
    reason = options.get("reason")
    with acting_as(who):
        report = bulk.run(queryset, name,
                          reason=f"{reason} ({who})" if reason else f"by {who}")
    if as_json:
        cli.emit(command, {"action": action, "filters": filters, "matched": matched,
                           "done": True, "met": report.met, "changed": report.changed,
                           "left": report.left, "batches": report.batches,
                           "seconds": round(report.seconds, 3)})
        return
    command.stdout.write(
        f"{bulk.BULK_ACTIONS[name].done_word} {report.changed} of {report.met} matching "
        f"{states} job(s) in {report.batches} batch(es), {report.seconds:.1f} s"
        + (f"; {report.left} left (changed meanwhile, held by another transaction"
           + (", or a live job holds their key" if name == "retry" else "") + ")"
           if report.left else ""))


def operator() -> str:
    """Who acts, as the jobs' ``enqueued_by`` and the cancel's reason record it:
    ``cli:<login>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name (a container's user without a passwd entry)
        return "cli"
