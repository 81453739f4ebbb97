"""``manage.py xjobs resume ID``: the resume of a dead workflow, the repair part of the
``xjobs`` command (docs/durable.md, "Repairing a dead workflow").

    manage.py xjobs resume ID       a dead workflow (a job id, a UUID), once its cause is fixed
    manage.py xjobs resume QUEUE    a paused queue (any other name: management/pauses_cli.py)

``resume`` takes either: an argument that reads as a UUID names a job, anything else a queue.
A job that is not a dead workflow (not dead, or no step recorded) is refused with the reason
(exit status 1), an unknown id too; nothing is written then.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.management.base import CommandError

from .. import api
from ..console.reads.jobs import diagnose
from ..console.reads.text import db_now
from ..exceptions import JobNotFound
from ..records import ResumeResult
from . import cli

# What `resume` says of its argument, in its help and in its errors.
TAKES = "a dead workflow's job id (a UUID) or a paused queue's name"


def names_job(value: str) -> bool:
    """Whether ``xjobs resume``'s argument names a job (reads as a UUID) rather than a queue."""
    try:
        UUID(value.strip())
    except ValueError:
        return False
    return True


def handle(command: Any, options: dict[str, Any], as_json: bool) -> None:
    job_id = options["queue"].strip()
    try:
        result = api.resume(job_id)
    except JobNotFound:
        raise JobNotFound(f"no job with id {job_id} (resume takes {TAKES})") from None
    job = result.job
    assert job is not None
    if not result.changed:
        raise CommandError(f"resume: job {job.id} ({job.name}) was not resumed: it "
                           f"{result.reason}")
    if as_json:
        cli.emit(command, {"action": "resume", "changed": True, "reason": result.reason,
                           "job": cli.record_dict(job),
                           "reopened": [cli.record_dict(r) for r in result.reopened]})
        return
    command.stdout.write("\n".join(lines(result)))


def lines(result: ResumeResult) -> list[str]:
    """What a resume did, one line per step it opened again."""
    job = result.job
    assert job is not None
    head = f"resume: job {job.id} ({job.name}) is now {job.state}"
    if not result.reopened:
        return [f"{head}: its failure was not a child's, so it runs again from its recorded "
                "steps (its failed step, if any, runs again)"]
    out = [f"{head}; it goes on from its recorded steps once the step below has its children"]
    for r in result.reopened:
        whose = "" if r.job_id == job.id else f" of child workflow {r.job_id}"
        retried = ", ".join(str(c) for c in r.retried) or "none (already live or done)"
        out.append(f"  step {r.step!r}{whose} waits again; child job(s) retried: {retried}")
    return out


def dead_lines(job: Any, steps: list[Any]) -> list[str]:
    """``xjobs show``'s diagnosis of a dead job, above its error: what failed (for a workflow
    dead of a failed child: the step, the child and the child's error) and what resumes it."""
    if job.state != "dead":
        return []
    return [f"{'diagnosis' if n == 0 else '':>16}{':' if n == 0 else ' '} {line}"
            for n, line in enumerate(diagnose(job, steps, db_now()))]
