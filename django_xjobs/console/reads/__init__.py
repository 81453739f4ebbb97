"""The operations console's reads: what the admin pages and ``manage.py xjobs`` show.

One read model serves both, so the browser and the command line never disagree (docs/console.md,
"The same from a terminal"): the admin renders these records as HTML, the command prints them
or dumps them as JSON. Everything here reads; the console's writes are the operator actions of
:mod:`django_xjobs.api` (cancel, retry, run_now, delete_finished), which go through the engine's
fenced statements.

A module per concern:

* :mod:`.scope`: the tenant scope of a request, and querysets restricted to it;
* :mod:`.text`: times and errors as a person reads them (the database clock in the ORM's form,
  a moment in the page's time zone, durations, "... ago", the line of an error read first);
* :mod:`.json_columns`: JSON columns read as text and shown without JSONField, and records
  as JSON-ready values (``--json``);
* :mod:`.jobs`: a job in a panel, its diagnosis, the jobs list, one job's row, steps and
  children;
* :mod:`.tables`: the lists of the other tables (events, outbox, concurrency slots with their
  limits, backfills);
* :mod:`.dashboard`: the dashboard (queues, outbox, scheduler, workers, latest failures);
* :mod:`.health`: the health panel, its thresholds and verdicts, and the fleet of workers.

Where the numbers come from:

* the dashboard's per-queue live buckets are the engine's ``queue_depth`` (the live rows'
  partial indexes only, never the history); what each queue finished in the last 24 hours and
  the charts are the counters (:mod:`django_xjobs.counters`), whose cost does not grow with the
  jobs table. The counters count every tenant's jobs, so under a tenant scope the finished
  counts are read from the rows instead (``x_jobs_finished_idx``, per state) and the charts
  are not shown;
* the health figures of the tables and of the server are the engine's monitoring statements
  (``tables_health``, ``xmin_horizon``); the rest are read-only ORM reads of the models;
* time is the database's: "expired", "due" and "recently" compare with ``now()`` of the server,
  the clock every lease is measured on.

Tenant scope (``XJOBS["ADMIN_TENANT_SCOPE"]``): a callable ``(request) -> set of tenant ids |
None``. With a set, every read here is filtered to those tenants' rows, and what has no tenant
column (events, slots, backfills, the scheduler, the database's own health) is not shown at all:
it may name other tenants' data (``tenant:acme`` slot keys) or the fleet's hosts.
"""
