"""Django's admin autodiscovery imports each installed app's ``admin`` module: this one puts
the jobs models in the project's admin.

The console lives in its own package, ``django_xjobs/console/`` (docs/console.md). Each of its
model admins registers itself with the project's admin as it is defined
(``@admin.register``); importing them here is all autodiscovery needs. The console's own site
at ``/_x/`` (``console/sites.py``) registers the same classes.
"""

from .console import backfills, jobs, outbox, scheduler, slots, steps

__all__ = ["backfills", "jobs", "outbox", "scheduler", "slots", "steps"]
