"""The configured cron tasks: ``@job(cron=...)`` definitions and ``XJOBS["SCHEDULE"]`` entries.

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
from . import cron


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    name: str
    job: str
    schedule: cron.CronSchedule
    misfire: str = "latest"
    overlap: str = "allow"  # docs/scheduling.md, "Overlap"
    input: Mapping[str, Any] = field(default_factory=dict)
    source: str = "settings"  # "job": @job(cron=...); "settings": XJOBS["SCHEDULE"]

    @property
    def enqueued_by(self) -> str:
        return f"cron:{self.name}"


@dataclass(frozen=True, slots=True)
class Problem:
    """A configuration error of one task, for the system checks (``checks.py``)."""

    id: str
    task: str
    message: str


# Check ids, one per kind of mistake (docs/scheduling.md lists them).
BAD_CRON, BAD_TIMEZONE, UNKNOWN_JOB, BAD_INPUT, DUPLICATE_TASK = (
    "xjobs.E010", "xjobs.E011", "xjobs.E012", "xjobs.E013", "xjobs.E014",
)


def _from_jobs() -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    for definition in registry.all_jobs().values():
        options = definition.options
        if options.get("cron") is None:
            continue
        # Already validated when decorated (scheduler/options.py); parse() is the same call.
        tasks[definition.name] = Task(
            name=definition.name, job=definition.name,
            schedule=cron.parse(options["cron"], options.get("timezone", "UTC"),
                                what=f"{definition.name}: cron"),
            misfire=options.get("misfire", "latest"), source="job",
            overlap=options.get("overlap", "allow"),
        )
    return tasks


def _settings_entry(task: str, entry: Mapping[str, Any], payload_limit: int) -> Task | Problem:
    """One XJOBS["SCHEDULE"] entry (its shape already checked by conf.py) as a Task, or the
    first problem with it."""

    where = f'XJOBS["SCHEDULE"][{task!r}]'
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
    # The input every occurrence is enqueued with must bind to the job's signature, or each
    # run would fail with a TypeError (tests/unit/test_validation.py).
    mismatch = definition.shape.mismatch(entry["input"].keys())
    if mismatch:
        return Problem(BAD_INPUT, task, (
            f"{where}['input'] does not fit {definition.shape.call}: {mismatch}"
        ))
    try:
        encode_json(entry["input"], what=f"{where}['input']", limit=payload_limit)
    except InvalidJobInput as exc:
        return Problem(BAD_INPUT, task, str(exc))
    return Task(name=task, job=entry["job"], schedule=schedule, misfire=entry["misfire"],
                overlap=entry["overlap"], input=dict(entry["input"]), source="settings")


def collect() -> tuple[dict[str, Task], list[Problem]]:
    """Every task that is configured correctly, and a problem for each one that is not."""
    settings = conf.get()
    tasks = _from_jobs()
    problems: list[Problem] = []
    for name, entry in settings.schedule.items():
        if name in tasks:
            problems.append(Problem(DUPLICATE_TASK, name, (
                f'XJOBS["SCHEDULE"][{name!r}]: a task of that name is already declared by '
                f"@job(cron=...) on {name}; give the schedule entry another name"
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
