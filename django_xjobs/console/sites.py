"""The operations console as its own admin site, mounted at ``/_x/`` (docs/console.md).

``path("_x/", include("django_xjobs.urls"))`` serves it: a Django ``AdminSite`` named
:data:`SITE_NAME` (its URL namespace) with the jobs models only, registered with the same
``ModelAdmin`` classes as the project's main admin, so every page, action and permission is the
same under both; its index is the dashboard. Login, logout and the password pages come with
``AdminSite``. The models stay registered in the project's main admin too: each model admin
registers itself there (``@admin.register``), and ``django_xjobs/admin.py``, which Django's
admin autodiscovery imports, imports them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from ..models import (
    Backfill,
    Job,
    JobEvent,
    JobLease,
    JobStep,
    OutboxEntry,
    SchedulerLeader,
    SchedulerState,
)
from .backfills import BackfillAdmin
from .databases import in_request_database
from .jobs import JobAdmin
from .outbox import OutboxEntryAdmin
from .scheduler import SchedulerLeaderAdmin, SchedulerStateAdmin
from .slots import JobLeaseAdmin
from .steps import JobEventAdmin, JobStepAdmin

SITE_NAME = "xjobs_console"

MODEL_ADMINS: tuple[tuple[type[Any], type[admin.ModelAdmin]], ...] = (
    (Job, JobAdmin),
    (JobStep, JobStepAdmin),
    (JobEvent, JobEventAdmin),
    (OutboxEntry, OutboxEntryAdmin),
    (JobLease, JobLeaseAdmin),
    (SchedulerLeader, SchedulerLeaderAdmin),
    (SchedulerState, SchedulerStateAdmin),
    (Backfill, BackfillAdmin),
)


class ConsoleSite(admin.AdminSite):
    """The jobs models' pages and nothing else; the index is the dashboard, with the dashboard's
    permission (``django_xjobs.view_job``), like the dashboard under the main admin."""

    site_header = "django-xjobs console"
    site_title = "django-xjobs console"
    index_title = "Jobs dashboard"

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None,
              ) -> HttpResponse:
        job_admin = self.get_model_admin(Job)
        assert isinstance(job_admin, JobAdmin)
        return in_request_database(job_admin.dashboard_view)(request)


site = ConsoleSite(name=SITE_NAME)
for _model, _model_admin in MODEL_ADMINS:
    site.register(_model, _model_admin)
