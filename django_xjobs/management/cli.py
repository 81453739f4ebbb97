"""What the ``xjobs*`` management commands share: their base class (exit statuses, a closed
stdout, Django's own options after a subcommand), JSON output (``--json``), the translation of
the package's errors into ``CommandError``, and log lines on stderr for the commands that run
until they are stopped (worker, relay, scheduler)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError

from .. import conf
from ..exceptions import ConfigurationError, InvalidJobInput, LiveJobExists, XJobsError

# The exit status of every ``manage.py xjobs*`` command (docs/reference/commands.md, "Exit
# status"): 0 done; FAILED a verdict that is not good (``xjobs health`` unhealthy, a deploy
# check that finds a run that would diverge, a soak whose invariant failed) or an operation
# refused or failed for a reason other than its arguments; USAGE bad usage, argparse's own
# status, for every bad argument found after parsing too. ``xjobs health`` adds 3, an
# unreachable database (management/workers_cli.py).
FAILED, USAGE = 1, 2
# Stdout closed by its reader before the command wrote everything (``xjobs health | head -1``):
# 128 + SIGPIPE (13), the status a shell reports for a program that SIGPIPE ended.
CLOSED_PIPE = 141
# Django's options every command takes (BaseCommand.create_parser), accepted after a
# subcommand too: ``manage.py xjobs check-deploy -v 2``.
DJANGO_OPTIONS = ("verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color",
                  "skip_checks")


class XJobsCommand(BaseCommand):
    """The base of the ``xjobs*`` commands: Django's options after a subcommand as before it,
    and a stdout closed by its reader ends the command quietly (CLOSED_PIPE), no traceback."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        own = [a for a in parser._actions if a.dest in DJANGO_OPTIONS]
        _accept_options(parser, own)
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        try:
            try:
                super().run_from_argv(argv)
            finally:  # what is still buffered, while a closed pipe can still be told apart
                sys.stdout.flush()
        except BrokenPipeError:
            # Whatever is left in the buffer goes nowhere, rather than failing again (with a
            # traceback) when the interpreter flushes it on its way out.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            sys.exit(CLOSED_PIPE)


def _accept_options(parser: Any, options: list[Any]) -> None:
    """Add ``options`` (Django's, of the top parser) to every subcommand's parser below
    ``parser``, unlisted in its --help and changing nothing when not given."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in action.choices.values():
            for option in options:
                if any(s in sub._option_string_actions for s in option.option_strings):
                    continue
                kwargs: dict[str, Any] = {"dest": option.dest, "default": argparse.SUPPRESS,
                                          "help": argparse.SUPPRESS}
                if option.nargs == 0:  # a flag: --traceback, --no-color, ...
                    kwargs.update(action="store_const", const=option.const)
                else:
                    kwargs.update(type=option.type, choices=option.choices,
                                  metavar=option.metavar)
                sub.add_argument(*option.option_strings, **kwargs)
            _accept_options(sub, options)


def usage_error(message: str) -> CommandError:
    """A bad argument found after parsing: exit status USAGE, as argparse's own."""
    return CommandError(message, returncode=USAGE)


def bad_input(exc: XJobsError) -> bool:
    """Whether a package error says the command's input was bad (exit status USAGE): a value
    the package refuses (an option, a name, a duration) or an argument that names nothing (a
    job id, a job or task name, a backfill or its run). Any other (a job in a state the action
    does not apply to, a live job holding the key, a database the package cannot run on) is
    the operation's refusal or failure: FAILED."""
    return isinstance(exc, ConfigurationError | InvalidJobInput | LookupError)


def check_job_ids(options: dict[str, Any]) -> None:
    """``job_id`` / ``job_ids`` arguments that are not UUIDs are bad usage, said as such (not
    as a job that does not exist)."""
    given = options.get("job_ids") or []
    if options.get("job_id") is not None:
        given = [options["job_id"], *given]
    for value in given:
        if isinstance(value, UUID):
            continue
        try:
            UUID(str(value))
        except ValueError:
            raise usage_error(f"{value!r} is not a job id (a UUID)") from None


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


SHARD_HELP = ("with the jobs sharded by tenant (XJOBS['SHARDS']), the shard to read and act "
              "on; default the home shard, XJOBS['DATABASE'] (a job id is found on any shard)")


def add_shard_flag(parser: Any, *, top: bool = False) -> None:
    """``--shard ALIAS`` on the command and on each subcommand (docs/scaling.md)."""
    parser.add_argument("--shard", metavar="ALIAS", help=SHARD_HELP,
                        **({} if top else {"default": argparse.SUPPRESS}))


def checked_shard(alias: str | None) -> str | None:
    """``alias`` when it names a shard (or the one database), else a usage error naming them."""
    shards = conf.get().job_databases
    if alias is not None and alias not in shards:
        raise usage_error(f"--shard {alias}: not a shard; the shards are {', '.join(shards)}")
    return alias


@contextmanager
def on_shard(alias: str | None) -> Iterator[None]:
    """The command's work on shard ``alias`` (None: the home database)."""
    with conf.using_database(checked_shard(alias)):
        yield


@contextmanager
def command_errors() -> Iterator[None]:
    """The package's errors end the command with their message, no traceback: exit status
    USAGE for bad input (:func:`bad_input`), FAILED otherwise; a live job in the way names the
    command that shows it."""
    try:
        yield
    except LiveJobExists as exc:
        raise CommandError(f"{exc} (see: manage.py xjobs show {exc.live_job_id})",
                           returncode=FAILED) from None
    except XJobsError as exc:
        raise CommandError(str(exc), returncode=USAGE if bad_input(exc) else FAILED) from None


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
