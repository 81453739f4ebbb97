"""The configured tasks: ``@job(cron=...)`` and ``@job(every=...)`` definitions and
``XJOBS["SCHEDULE"]`` entries, each a cron expression (``cron.py``) or an interval
(``interval.py``).

A task is named by its job's name (``@job(cron=...)``) or by its key in ``XJOBS["SCHEDULE"]``;
the name is what its watermark row, its idempotency keys (``cron:<task>:<occurrence>``) and
``enqueued_by`` (``cron:<task>``) carry, so renaming a task starts it afresh (from now).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import conf, registry
from ..exceptions import ConfigurationError, InvalidJobInput
from ..values import encode_json
from . import cron, interval

# When a task fires: the two kinds walk their occurrences alike (cron.Occurrences).
Schedule = cron.CronSchedule | interval.IntervalSchedule


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    name: str
    job: str
    schedule: Schedule
    misfire: str = "latest"
    overlap: str = "allow"  # docs/scheduling.md, "Overlap"
    input: Mapping[str, Any] = field(default_factory=dict)
    source: str = "settings"  # "job": @job(cron=...) or @job(every=...); "settings": XJOBS[...]
    # A schedule entry's own queue and priority; None: the job's.
    queue: str | None = None
    priority: int | None = None

    @property
    def enqueued_by(self) -> str:
        return f"cron:{self.name}"

    @property
    def enqueue_options(self) -> dict[str, Any]:
        """The queue and priority each occurrence is enqueued with, where the entry gives them."""
        options: dict[str, Any] = {}
        if self.queue is not None:
            options["queue"] = self.queue
        if self.priority is not None:
            options["priority"] = self.priority
        return options


@dataclass(frozen=True, slots=True)
class Problem:
    """A configuration error of one task, for the system checks (``checks.py``)."""

    id: str
    task: str
    message: str


# Check ids, one per kind of mistake (docs/scheduling.md lists them).
BAD_CRON, BAD_TIMEZONE, UNKNOWN_JOB, BAD_INPUT, DUPLICATE_TASK, BAD_INTERVAL = (
    "xjobs.E010", "xjobs.E011", "xjobs.E012", "xjobs.E013", "xjobs.E014", "xjobs.E015",
)


def _from_jobs() -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    for definition in registry.all_jobs().values():
        options = definition.options
        schedule: Schedule
        # Already validated when decorated (scheduler/options.py); parse() is the same call.
        if options.get("cron") is not None:
            schedule = cron.parse(options["cron"], options.get("timezone", "UTC"),
                                  what=f"{definition.name}: cron")
        elif options.get("every") is not None:
            schedule = interval.parse(options["every"], what=f"{definition.name}: every")
        else:
            continue
        tasks[definition.name] = Task(
            name=definition.name, job=definition.name, schedule=schedule,
            misfire=options.get("misfire", "latest"), source="job",
            overlap=options.get("overlap", "allow"),
        )
    return tasks


def _settings_entry(task: str, entry: Mapping[str, Any], payload_limit: int) -> Task | Problem:
    """One XJOBS["SCHEDULE"] entry (its shape already checked by conf.py) as a Task, or the
    first problem with it."""

    where = f'XJOBS["SCHEDULE"][{task!r}]'
    schedule: Schedule
    if entry["every"] is not None:
        try:
            schedule = interval.parse(entry["every"], what=f"{where}: every")
        except ConfigurationError as exc:
            return Problem(BAD_INTERVAL, task, str(exc))
    else:
        try:
            zone = cron.parse_timezone(entry["timezone"], what=where)
        except ConfigurationError as exc:
            return Problem(BAD_TIMEZONE, task, str(exc))
        try:
            schedule = cron.parse(entry["cron"], zone, what=f"{where}: cron")
        except ConfigurationError as exc:
            return Problem(BAD_CRON, task, str(exc))
    definition = registry.lookup(entry["job"])
    if definition is None:
        return Problem(UNKNOWN_JOB, task, (
            f"{where}: no job named {entry['job']!r} is registered: "
            f"{registry.expected_home(entry['job'])}; registered: {sorted(registry.all_jobs())}"
        ))
    arguments = dict(entry["input"])
    if entry["args"]:
        # Positional arguments (an entry imported from a Celery beat schedule, say) are stored
        # under the names of the parameters they fill, as enqueue(*args) stores them; only now
        # can they be: the registry was empty when the settings were read.
        try:
            arguments = definition.shape.merge(entry["job"], tuple(entry["args"]), arguments)
        except InvalidJobInput as exc:
            return Problem(BAD_INPUT, task, f"{where}['args']: {exc}")
    # The input every occurrence is enqueued with must bind to the job's signature, or each
    # run would fail with a TypeError (tests/unit/test_validation.py).
    mismatch = definition.shape.mismatch(arguments.keys())
    if mismatch:
        given = "['input'] and ['args'] do" if entry["args"] else "['input'] does"
        return Problem(BAD_INPUT, task, (
            f"{where}{given} not fit {definition.shape.call}: {mismatch}"
        ))
    try:
        encode_json(arguments, what=f"{where}['input']", limit=payload_limit)
    except InvalidJobInput as exc:
        return Problem(BAD_INPUT, task, str(exc))
    return Task(name=task, job=entry["job"], schedule=schedule, misfire=entry["misfire"],
                overlap=entry["overlap"], input=arguments, source="settings",
                queue=entry["queue"], priority=entry["priority"])


def collect() -> tuple[dict[str, Task], list[Problem]]:
    """Every task that is configured correctly, and a problem for each one that is not."""
    settings = conf.get()
    tasks = _from_jobs()
    problems: list[Problem] = []
    for name, entry in settings.schedule.items():
        if name in tasks:
            option = "every" if isinstance(tasks[name].schedule, interval.IntervalSchedule) \
                else "cron"
            problems.append(Problem(DUPLICATE_TASK, name, (
                f'XJOBS["SCHEDULE"][{name!r}]: a task of that name is already declared by '
                f"@job({option}=...) on {name}; give the schedule entry another name"
            )))
            continue
        found = _settings_entry(name, entry, settings.max_payload_bytes)
        if isinstance(found, Problem):
            problems.append(found)
        else:
            tasks[name] = found
    return dict(sorted(tasks.items())), problems


def configured() -> dict[str, Task]:
    """The configured tasks by name; raises ConfigurationError if any is misconfigured."""
    tasks, problems = collect()
    if problems:
        raise ConfigurationError("; ".join(p.message for p in problems))
    return tasks
