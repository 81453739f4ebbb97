"""The console's operator actions on jobs: cancel, retry now, resume a dead workflow, run now,
delete finished.

The admin reads; an action calls :mod:`django_xjobs.api`, which runs the engine's fenced
statements, the same ones ``manage.py xjobs`` and the worker use: never ``queryset.update()``
on queue state (docs/console.md). Each action has its own permission (``Job.Meta.permissions``),
a confirmation page, a result message with counts, and an entry in Django's admin log naming
the user. Under a tenant scope every statement is restricted to the scope's tenants
(``tenant_ids=``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme

from .. import api
from ..api import acting_as
from ..exceptions import (
    ChildFailed,
    JobNotFound,
    LiveJobExists,
    XJobsError,
    class_path,
    split_recorded_error,
)
from ..models import Job
from ..records import LIVE_STATES, TERMINAL_STATES
from . import bulk
from .options import ConsoleAdmin
from .reads.scope import tenant_scope
from .reads.text import as_uuid

# One action on selected rows touches at most this many jobs (one statement each); "select all"
# of more is done in rounds, and the result message says so. Retry, cancel and delete over the
# whole filter have no such bound: run_over_filter, below.
ACTION_LIMIT = 1000


class CancelForm(forms.Form):
    reason = forms.CharField(
        required=False, max_length=1500, widget=forms.TextInput(attrs={"size": 60}),
        help_text="Recorded in the job's last_error, with your username.",
    )


def dead_of_a_child(job: Job) -> bool:
    """Whether ``job`` is a workflow dead of a failed child job (its recorded error is a
    ChildFailed): the jobs "Resume workflow" applies to (docs/durable.md, "Repairing a dead
    workflow")."""
    recorded = split_recorded_error(job.last_error or "") if job.state == "dead" else None
    return recorded is not None and recorded[0] == class_path(ChildFailed)


@dataclass(frozen=True)
class ActionSpec:
    """One operator action: its permission, which states it applies to, and the words."""

    name: str
    permission: str  # codename in Job.Meta.permissions
    verb: str  # "cancel" -> "Cancelled 3 jobs"
    done_word: str
    applies: Callable[[Job], bool]
    explain: str


ACTIONS: dict[str, ActionSpec] = {spec.name: spec for spec in (
    ActionSpec("cancel_jobs", "cancel_job", "cancel", "cancelled",
               lambda j: j.state in LIVE_STATES,
               "A live job (ready, delayed, running, suspended) becomes cancelled and is never "
               "run again. A running one stops at its worker's next heartbeat; its late result "
               "is discarded."),
    ActionSpec("retry_jobs", "retry_job", "retry", "retried",
               lambda j: j.state in ("dead", "cancelled"),
               "A dead or cancelled job gets a fresh set of attempts and is due now; its "
               "completed steps are kept. A workflow dead of a failed child job (ChildFailed) "
               "replays that recorded failure and is dead again at once: resume it instead "
               "(Resume workflow). A job whose idempotency key another live job holds is "
               "skipped."),
    ActionSpec("resume_workflows", "resume_job", "resume workflow", "resumed", dead_of_a_child,
               "A workflow dead because a child job failed (ChildFailed), once the child's "
               "cause is fixed: the failed child gets a fresh set of attempts, the failed "
               "invoke or gather step waits for it again, and the workflow, due now with a "
               "fresh set of attempts, goes on past that step once the child succeeds; its "
               "completed steps are not run again (a child that is a dead workflow itself is "
               "resumed likewise). Other jobs are skipped: Retry runs them again."),
    ActionSpec("run_jobs_now", "run_job_now", "run now", "made due now",
               lambda j: j.state in ("delayed", "suspended") or j.state == "ready",
               "A delayed or suspended job (or a ready one due later) becomes due at once; a "
               "suspended one's open sleep or event wait ends (the wait returns None)."),
    ActionSpec("delete_finished_jobs", "purge_job", "delete", "deleted",
               lambda j: j.state in TERMINAL_STATES,
               "Finished jobs (done, dead, cancelled) and their steps are deleted for good. "
               "Live jobs are left alone: cancel them first."),
)}


def guarded_action(spec: ActionSpec) -> Any:
    """``spec`` as a Django admin action, offered to holders of its permission only."""
    def action(modeladmin: ConsoleAdmin, request: HttpRequest, queryset: Any) -> Any:
        return run_action(modeladmin, spec, request, queryset)

    action.__name__ = spec.name
    # Django asks JobAdmin.has_<short>_permission(request) before it offers the action.
    short = {"cancel_job": "cancel", "retry_job": "retry", "resume_job": "resume",
             "run_job_now": "run", "purge_job": "purge"}[spec.permission]
    descriptions = {"cancel_jobs": "Cancel selected jobs…",
                    "retry_jobs": "Retry selected jobs now…",
                    "resume_workflows": "Resume selected dead workflows…",
                    "run_jobs_now": "Run selected jobs now…",
                    "delete_finished_jobs": "Delete selected finished jobs…"}
    return admin.action(description=descriptions[spec.name], permissions=[short])(action)


def vet_action_post(model_admin: ConsoleAdmin, request: Any) -> None:
    """An action's POST before Django's changelist runs it: an action of :data:`ACTIONS` the
    user may not run is refused, and a malformed id in the selection is dropped (it must not
    become a database error)."""
    if request.method == "POST" and "action" in request.POST:
        names = request.POST.getlist("action")
        try:
            name = names[int(request.POST.get("index", 0))]
        except (ValueError, IndexError):
            name = None
        if name in ACTIONS and name not in model_admin.get_actions(request):
            raise PermissionDenied(f"you may not {ACTIONS[name].verb} jobs")
        # A malformed id in the selection must not become a database error: drop it.
        post = request.POST.copy()
        post.setlist(helpers.ACTION_CHECKBOX_NAME, [
            v for v in post.getlist(helpers.ACTION_CHECKBOX_NAME) if as_uuid(v)])
        request.POST = post


def run_action(model_admin: ConsoleAdmin, spec: ActionSpec, request: Any,
               queryset: Any) -> Any:
    """One of :data:`ACTIONS` on the selected jobs: its confirmation page first, then,
    once confirmed, the API's call for each job (at most :data:`ACTION_LIMIT`)."""
    if spec.name not in model_admin.get_actions(request):  # belt and braces: see vet_action_post
        raise PermissionDenied
    if request.POST.get("select_across") == "1" and spec.name in BULK:
        return run_over_filter(model_admin, spec, request, queryset)
    chosen = list(queryset.order_by("-id")[: ACTION_LIMIT + 1])
    truncated = len(chosen) > ACTION_LIMIT
    chosen = chosen[:ACTION_LIMIT]
    form = CancelForm(request.POST if "post" in request.POST else None)
    if "post" not in request.POST or (spec.name == "cancel_jobs" and not form.is_valid()):
        return _confirm(model_admin, request, spec, chosen, truncated, form)
    return _apply(model_admin, request, spec, chosen, truncated, form)


def _confirm(model_admin: ConsoleAdmin, request: Any, spec: ActionSpec, chosen: list[Job],
             truncated: bool, form: CancelForm) -> HttpResponse:
    applies = [j for j in chosen if spec.applies(j)]
    context = {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": f"{spec.verb.capitalize()} jobs: are you sure?", "spec": spec,
        "crumb": spec.verb.capitalize(),
        "applies": applies, "skipped": [j for j in chosen if not spec.applies(j)],
        "chosen": chosen, "truncated": truncated, "limit": ACTION_LIMIT,
        "form": form if spec.name == "cancel_jobs" else None,
        "select_across": request.POST.get("select_across") == "1",
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "next": _next_url(request),
    }
    return TemplateResponse(request, "admin/django_xjobs/action_confirm.html", context)


def _next_url(request: Any) -> str | None:
    url = request.POST.get("_next")
    if url and url_has_allowed_host_and_scheme(url, {request.get_host()},
                                               request.is_secure()):
        return str(url)
    return None


def _apply(model_admin: ConsoleAdmin, request: Any, spec: ActionSpec, chosen: list[Job],
           truncated: bool, form: CancelForm) -> Any:
    tenants = tenant_scope(request)
    who = f"admin:{request.user.get_username()}"
    changed: list[Job] = []
    skipped: dict[str, int] = {}
    live_holders: list[str] = []

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    with acting_as(who):
        if spec.name == "delete_finished_jobs":
            finished = [j for j in chosen if spec.applies(j)]
            for j in chosen:
                if not spec.applies(j):
                    skip(f"{j.state} (only finished jobs are deleted)")
            api.delete_finished([j.id for j in finished], tenant_ids=tenants)
            remaining = set(Job.objects.filter(id__in=[j.id for j in finished])
                            .values_list("id", flat=True))
            changed = [j for j in finished if j.id not in remaining]
            for _ in range(len(finished) - len(changed)):
                skip("changed meanwhile (retried or locked)")
        else:
            reason = (form.cleaned_data.get("reason") or "").strip() if (
                spec.name == "cancel_jobs" and form.is_valid()) else ""
            for j in chosen:
                if spec.name in ("cancel_jobs", "resume_workflows") and not spec.applies(j):
                    skip(f"already {j.state}" if spec.name == "cancel_jobs" else
                         "not dead of a failed child (Retry runs it again)")
                    continue
                try:
                    if spec.name == "cancel_jobs":
                        result = api.cancel(
                            j.id, reason=f"{reason} ({who})" if reason else f"by {who}",
                            tenant_ids=tenants)
                    elif spec.name == "retry_jobs":
                        result = api.retry(j.id, tenant_ids=tenants)
                    elif spec.name == "resume_workflows":
                        result = api.resume(j.id, tenant_ids=tenants)
                    else:
                        result = api.run_now(j.id, tenant_ids=tenants)
                except LiveJobExists as exc:
                    skip("a live job holds its idempotency key")
                    if exc.live_job_id:
                        live_holders.append(exc.live_job_id)
                    continue
                except JobNotFound:
                    skip("gone")
                    continue
                except XJobsError as exc:
                    skip(str(exc))
                    continue
                if result.changed:
                    changed.append(j)
                else:
                    skip(result.reason or "unchanged")
    if changed:
        message = {"cancel_jobs": f"Cancelled by {who}" + (f": {reason}" if spec.name ==
                                                             "cancel_jobs" and reason
                                                             else ""),
                   "retry_jobs": f"Retried now by {who}",
                   "resume_workflows": f"Workflow resumed by {who}",
                   "run_jobs_now": f"Made due now by {who}",
                   "delete_finished_jobs": f"Deleted by {who}"}[spec.name]
        LogEntry.objects.log_actions(
            user_id=request.user.pk, queryset=changed,
            action_flag=DELETION if spec.name == "delete_finished_jobs" else CHANGE,
            change_message=message,
        )
    _report(model_admin, request, spec, changed, skipped, live_holders, truncated)
    nxt = _next_url(request)
    if nxt and not (spec.name == "delete_finished_jobs" and changed):
        return HttpResponseRedirect(nxt)
    return None


def _report(model_admin: ConsoleAdmin, request: Any, spec: ActionSpec, changed: list[Job],
            skipped: dict[str, int], live_holders: list[str], truncated: bool) -> None:
    n = len(changed)
    level = messages.SUCCESS if n else messages.WARNING
    text = f"{spec.done_word.capitalize()} {n} job{'s' if n != 1 else ''}."
    if skipped:
        parts = ", ".join(why if len(skipped) == 1 else f"{why} ({count})"
                          for why, count in sorted(skipped.items()))
        text += f" Skipped {sum(skipped.values())}: {parts}."
    if truncated:
        text += (f" Only the first {ACTION_LIMIT} of the selection were handled: run the "
                 "action again for the rest.")
    if live_holders:
        links = format_html_join(
            ", ", '<a href="{}">{}</a>',
            ((model_admin.url("django_xjobs_job_change", i), i)
             for i in live_holders[:5]))
        model_admin.message_user(
            request, format_html("{} Live job(s) holding the key: {}.", text, links), level)
    else:
        model_admin.message_user(request, text, level)


# ------------------------------------------------------------------------ over a filter --
# "Select all N jobs" on the list: the action runs over every job the filter matches, counted
# before it is confirmed, a batch per statement (console/bulk.py; docs/console.md, "Acting on
# thousands"), with the single action's permission and log entries.

BULK = {"retry_jobs": "retry", "cancel_jobs": "cancel", "delete_finished_jobs": "delete"}


def run_over_filter(model_admin: ConsoleAdmin, spec: ActionSpec, request: Any,
                    queryset: Any) -> Any:
    action = BULK[spec.name]
    form = CancelForm(request.POST if "post" in request.POST else None)
    matched = bulk.count(queryset, action)
    if matched > bulk.LIMIT:
        model_admin.message_user(
            request, f"More than {bulk.LIMIT:,} jobs match this filter: an action over a "
            "filter takes at most that many. Narrow the filter.", messages.ERROR)
        return None
    if "post" not in request.POST or (action == "cancel" and not form.is_valid()):
        context = {
            **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
            "title": f"{spec.verb.capitalize()} every matching job: are you sure?",
            "spec": spec, "crumb": spec.verb.capitalize(), "matched": matched,
            "states": ", ".join(bulk.BULK_ACTIONS[action].states),
            "filters": [(k, v) for k, v in request.GET.items() if k not in ("p", "o")],
            "form": form if action == "cancel" else None, "batch": bulk.BATCH,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/django_xjobs/action_bulk_confirm.html",
                                context)
    who = f"admin:{request.user.get_username()}"
    reason = (form.cleaned_data.get("reason") or "").strip() if action == "cancel" else ""
    flag = DELETION if action == "delete" else CHANGE
    message = {"retry": f"Retried now by {who} (over a filter)",
               "cancel": f"Cancelled by {who} (over a filter)" + (f": {reason}" if reason
                                                                  else ""),
               "delete": f"Deleted by {who} (over a filter)"}[action]
    content_type = ContentType.objects.get_for_model(Job)

    def log(jobs: list[tuple[Any, str]], changed: list[Any]) -> None:
        names = dict(jobs)
        LogEntry.objects.bulk_create([
            LogEntry(user_id=request.user.pk, content_type=content_type,
                     object_id=str(job_id), object_repr=names[job_id][:200],
                     action_flag=flag, change_message=message)
            for job_id in changed])

    with acting_as(who):
        report = bulk.run(queryset, action, tenant_ids=tenant_scope(request),
                          reason=f"{reason} ({who})" if reason else f"by {who}",
                          on_batch=log)
    text = (f"{spec.done_word.capitalize()} {report.changed:,} of the {report.met:,} "
            f"matching {'/'.join(bulk.BULK_ACTIONS[action].states)} jobs, in "
            f"{report.batches} batch{'es' if report.batches != 1 else ''} "
            f"({report.seconds:.1f} s).")
    if report.left:
        text += (f" {report.left:,} were left: changed meanwhile, held by another "
                 "transaction" + (", or a live job holds their key" if action == "retry"
                                  else "") + ".")
    model_admin.message_user(request, text,
                             messages.SUCCESS if report.changed else messages.WARNING)
    return None
