"""Pausing and resuming a queue or a concurrency key from the console (docs/console.md,
"Pauses"): the calls of :mod:`django_xjobs.pauses`, which ``manage.py xjobs pause`` makes too,
each with an entry in Django's admin log naming the user."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse

from ...exceptions import ConfigurationError, XJobsError
from ...models import FlowPause
from ...pauses import (
    MAX_REASON,
    check_target,
    describe,
    parse_length,
    pause,
    resume_key,
    resume_queue,
)
from ..options import ConsoleAdmin
from ..reads.scope import tenant_scope

# How the console writes a pause's end (its messages and the admin log).
PAUSE_TIME = "%Y-%m-%d %H:%M:%S %Z"


class PauseForm(forms.Form):
    """The optional end and reason of a pause from the console (docs/console.md, "Pauses")."""

    duration = forms.CharField(
        required=False, max_length=40, widget=forms.TextInput(attrs={"size": 12}),
        help_text="How long, e.g. 30m, 2h, 1d. Empty: until someone resumes it.",
    )
    reason = forms.CharField(
        required=False, max_length=MAX_REASON - 200,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Shown with the pause, with your username.",
    )

    def clean_duration(self) -> float | None:
        text = self.cleaned_data["duration"].strip()
        if not text:
            return None
        try:
            return parse_length(text, what="duration")
        except ConfigurationError as exc:
            raise ValidationError(str(exc)) from None


def may_pause(model_admin: ConsoleAdmin, request: Any) -> bool:
    """Pausing and resuming queues and keys: the change permission of pauses, for an
    unscoped operator only (a pause holds back every tenant's jobs)."""
    return (model_admin.has_view_permission(request) and tenant_scope(request) is None
            and request.user.has_perm("django_xjobs.change_flowpause"))


def pause_view(model_admin: ConsoleAdmin, request: Any) -> HttpResponse:
    """POST only. ``op=resume`` resumes at once; ``op=pause`` shows a form for the
    optional duration and reason, and pauses once it is posted back with ``post=yes``."""
    if not may_pause(model_admin, request):
        raise PermissionDenied
    request.current_app = model_admin.admin_site.name
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    op, kind, name = (request.POST.get(f) for f in ("op", "kind", "name"))
    if op not in ("pause", "resume") or kind not in ("queue", "key") or not name:
        messages.error(request, "Unknown pause action.")
        return HttpResponseRedirect(model_admin.url("django_xjobs_dashboard"))
    try:
        check_target(kind, name)  # before any query names it (no NUL reaches the ORM)
        if op == "resume":
            return _resume(model_admin, request, kind, name)
        form = PauseForm(request.POST if "post" in request.POST else None)
        if "post" not in request.POST or not form.is_valid():
            return TemplateResponse(request, "admin/django_xjobs/pause_confirm.html", {
                **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
                "title": f"Pause {kind} {name}", "crumb": f"Pause {kind} {name}", "form": form,
                "kind": kind, "name": name,
            })
        seconds = form.cleaned_data["duration"]
        reason = form.cleaned_data["reason"] or None
        who = f"admin:{request.user.get_username()}"
        record = pause(
            kind, name, for_=timedelta(seconds=seconds) if seconds else None,
            reason=f"{reason} ({who})" if reason else who)
    except XJobsError as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(model_admin.url("django_xjobs_dashboard"))
    said = describe(record, when=PAUSE_TIME)
    _log_pause(request, record.kind, record.key, f"paused {said}")
    messages.success(request, f"Paused {kind} {name} {said}.")
    return HttpResponseRedirect(model_admin.url("django_xjobs_dashboard"))


def _resume(model_admin: ConsoleAdmin, request: Any, kind: str, name: str) -> HttpResponse:
    _log_pause(request, kind, name, "resumed")
    if kind == "queue":
        was = resume_queue(name)
        text = f"Resumed queue {name}." if was else f"Queue {name} was not paused."
    else:
        was, handed_back = resume_key(name)
        text = (f"Resumed key {name}" if was else f"Key {name} was not paused") + (
            f"; {handed_back} blocked job{'s' if handed_back != 1 else ''} handed back.")
    messages.success(request, text)
    return HttpResponseRedirect(model_admin.url("django_xjobs_dashboard"))


def _log_pause(request: Any, kind: str, name: str, message: str) -> None:
    """An entry in Django's admin log naming the user, like the job actions'."""
    rows = FlowPause.objects.filter(kind=kind, key=name)
    if rows.exists():
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=rows,
                                     action_flag=CHANGE, change_message=message)
