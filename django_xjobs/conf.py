"""Settings: the ``XJOBS`` dict, read into a frozen dataclass with documented defaults.

Every value has one place where it is parsed (here) and one place where it is judged
(``checks.py`` turns :func:`validate` problems into Django system-check errors, so a bad value
stops ``runserver``, ``migrate`` and ``xjobs_worker`` at startup with a message naming the key).

Durations accept seconds (int/float), a ``timedelta``, or a string such as ``"250ms"``, ``"30s"``,
``"5m"``, ``"2h"``, ``"7d"``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .exceptions import ConfigurationError
from .values import NAME_RE, check_name, keyword_input, parse_duration, parse_mebibytes

# Where the documentation is published, with a trailing slash: a page is DOCS_URL + "guide.md".
# The system checks' hints link it (a project that installed the package has no docs/ to read);
# pyproject.toml's [project.urls] "Documentation" is the same address
# (tests/unit/test_package_metadata.py::test_the_documentation_url_is_defined_once).
DOCS_URL = "https://github.com/django-xjobs/django-xjobs/blob/main/docs/"

# The package's version, its one source: pyproject.toml reads it from here (a literal, which
# setuptools reads without importing this module), `django_xjobs.__version__` and a worker's
# x_workers row give it. A constant, because reading the installed distribution's metadata
# costs a worker's start-up some 60 ms. docs/development.md, "Cutting a release".
VERSION = "0.2.0"


def default_heartbeat(lease: float) -> float:
    """The heartbeat interval that goes with ``lease`` when none is given: ``min(10s, lease / 3)``,
    so that a lease always sees at least three renewals (docs/guide.md, "Settings")."""
    return min(10.0, lease / 3)


DEFAULT_RETENTION = {"done": 7 * 86400.0, "cancelled": 7 * 86400.0, "dead": 30 * 86400.0}


# ---------------------------------------------------------------------------------- outbox --


@dataclass(frozen=True, slots=True)
class OutboxSettings:
    """``XJOBS["OUTBOX"]``: where ``enqueue_on_commit`` stages and how the relay works.

    ``databases``: the aliases whose ``x_outbox`` the relays read (``enqueue_on_commit(using=)``
    must name one of them); the first is where the admin reads the outbox. ``batch_size``: rows
    one relay transaction publishes. ``poll_interval``: how often a relay looks without a
    wake-up (default ``XJOBS["POLL_INTERVAL"]``).
    """

    databases: tuple[str, ...] = ("default",)
    batch_size: int = 500
    poll_interval: float = 1.0


_OUTBOX_KEYS = {"DATABASES", "BATCH_SIZE", "POLL_INTERVAL"}


def _outbox_settings(raw: Mapping[str, Any], key: str, default: OutboxSettings) -> OutboxSettings:
    """``XJOBS["OUTBOX"]``; ``default`` carries the poll interval (``XJOBS["POLL_INTERVAL"]``)."""
    options = raw.get(key, {})
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            'XJOBS["OUTBOX"] must be a dict like {"DATABASES": ["default"], "BATCH_SIZE": 500}'
        )
    unknown = sorted(set(options) - _OUTBOX_KEYS)
    if unknown:
        raise ConfigurationError(
            f'XJOBS["OUTBOX"] has unknown key(s) {unknown}; known keys: {sorted(_OUTBOX_KEYS)}'
        )
    databases = options.get("DATABASES", ["default"])
    if isinstance(databases, str) or not isinstance(databases, list | tuple) or not databases:
        raise ConfigurationError(
            'XJOBS["OUTBOX"]["DATABASES"] must be a non-empty list of database aliases,'
            f" got {databases!r}"
        )
    for alias in databases:
        if not isinstance(alias, str) or not alias:
            raise ConfigurationError(
                f'XJOBS["OUTBOX"]["DATABASES"]: {alias!r} is not a database alias'
            )
    if len(set(databases)) != len(databases):
        raise ConfigurationError(f'XJOBS["OUTBOX"]["DATABASES"] repeats an alias: {databases!r}')
    batch_size = _positive_int(options, "BATCH_SIZE", 500,
                               where='XJOBS["OUTBOX"]["BATCH_SIZE"]')
    poll_interval = default.poll_interval
    poll = options.get("POLL_INTERVAL")
    if poll is not None:
        poll_interval = parse_duration(poll, what='XJOBS["OUTBOX"]["POLL_INTERVAL"]')
        if poll_interval <= 0:
            raise ConfigurationError('XJOBS["OUTBOX"]["POLL_INTERVAL"] must be greater than zero')
    return OutboxSettings(databases=tuple(databases), batch_size=batch_size,
                          poll_interval=poll_interval)


# ------------------------------------------------------------------------------ end outbox --


@dataclass(frozen=True, slots=True)
class XJobsSettings:
    database: str = "default"
    queues: tuple[str, ...] = ("default",)
    # Whether XJOBS["QUEUES"] was given. If not, a worker works "default" and every queue a
    # registered job names (registry.worked_queues), so @job(queue="emails") needs no setting.
    queues_given: bool = False
    # Per-queue cap on the runs one worker holds at once (unset: only the worker's total).
    queue_concurrency: Mapping[str, int] = field(default_factory=dict)
    # Queues shared between tenants by weight (XJOBS["QUEUES"][q]["fair_by"] = "tenant"), and
    # the weights (XJOBS["QUEUES"][q]["weights"]; a tenant not named weighs 1, the NULL tenant
    # is ""). docs/flow-control.md, "Fair share between tenants".
    fair_queues: frozenset[str] = frozenset()
    queue_weights: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    concurrency: int = 10
    # Claimed-but-not-started jobs a worker may hold beyond its running ones. A claim asks for
    # up to concurrency + prefetch minus what is in flight: bigger batches are fewer round trips.
    # None ("auto"): sized to the observed run time (worker/capacity.py, PREFETCH_WINDOW).
    prefetch: int | None = None
    lease: float = 30.0
    heartbeat: float = 10.0
    # How often a worker refreshes its x_workers row, from its heartbeat thread (so at most
    # once per HEARTBEAT): a stopped worker reads as stalled after `xjobs health --max-stall`,
    # which must be longer (docs/observability.md, "Workers and health probes").
    worker_seen_interval: float = 10.0
    poll_interval: float = 1.0
    notify: bool = True
    # Server-side binding with statements prepared once per connection. Turn off behind a
    # transaction pooler that cannot keep prepared statements (PgBouncer < 1.21, or
    # max_prepared_statements = 0).
    prepared_statements: bool = True
    # The alias whose connection parameters the dedicated sessions use: the LISTEN connections
    # (the worker's wake-ups, the relay's on the jobs' alias) and the scheduler's advisory
    # session. None: the jobs' own alias. Behind a transaction pooler it names a direct
    # connection to the same database, so NOTIFY works (docs/deployment.md, "PgBouncer and other
    # connection poolers").
    listen_database: str | None = None
    max_payload_bytes: int = 1024 * 1024
    max_attempts: int = 3
    retry_base: float = 2.0
    retry_cap: float = 3600.0
    # A job whose name this worker does not know is given back, no attempt spent, due again
    # after the time it has waited so far (at least 1 s, so the waits double), at most this
    # long; once it has waited UNKNOWN_JOB_REPORT_AFTER the workers log it as an error and the
    # health panel lists it (docs/deployment.md, "New job types before their workers").
    unknown_job_retry_max: float = 60.0
    unknown_job_report_after: float = 600.0
    shutdown_grace: float = 30.0
    # Worker recycling, None for no limit: a worker process is replaced after settling this
    # many runs, or once its resident memory passes this many MiB (xjobs_worker
    # --max-jobs-per-process, --max-memory; docs/deployment.md, "Recycling worker processes").
    # Read by the command only: an in-process worker (testing.drain) never recycles.
    max_jobs_per_process: int | None = None
    max_memory: int | None = None
    # Completed runs are acknowledged in batches: at most this many, at most this old.
    ack_batch: int = 500
    ack_interval: float = 0.005
    retention: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RETENTION))
    schedule: Mapping[str, Any] = field(default_factory=dict)
    app_version: str | None = None
    admin_tenant_scope: str | None = None
    # ---- backfills: the pause between two batches of a pass, unless the backfill or
    # `xjobs_backfill start --throttle` says otherwise (seconds).
    backfill_throttle: float = 0.0
    raw: Mapping[str, Any] = field(default_factory=dict)
    outbox: OutboxSettings = field(default_factory=OutboxSettings)
    # ---- concurrency slots (slots.py) ----
    # XJOBS["CONCURRENCY_LIMITS"] as (prefix, limit) pairs, longest prefix first: the first
    # prefix a key starts with gives its limit, over the job's own Concurrency(limit=...).
    concurrency_limits: tuple[tuple[str, int], ...] = ()
    # How long a slot stays held without a renewal (a crashed or frozen holder blocks it that
    # long). Renewed with every heartbeat. Default: the lease.
    slot_ttl: float = 30.0
    # ---- scheduler (see _scheduler_settings below and docs/scheduling.md) ----
    leader: str = "lease"
    leader_lease: float = 15.0
    leader_renew: float = 5.0
    cron_misfire_grace: float = 20.0
    cron_max_catchup: int = 100
    maintenance_interval: float | None = 60.0
    maintenance_batch: int = 1000
    # Finished jobs move out of x_jobs into the history tables this long after they finish
    # (docs/scheduling.md, "History tables"); None keeps them in x_jobs.
    archive_after: float | None = 10.0
    outbox_retention: float = 86400.0
    slot_purge_grace: float = 30.0
    # XJOBS["ROUTES"]: (pattern, queue) in the order given, the pattern compiled from a
    # shell-style glob ("emails.*"); the first that matches a job's name gives its queue when
    # @job named none (registry.JobDefinition.queue; docs/guide.md, "Routing by name").
    routes: tuple[tuple[re.Pattern[str], str], ...] = ()
    # ---- tests: "inline" runs each job at enqueue, when its transaction commits (testing/).
    test_mode: str | None = None
    # ---- the console: how often its pages update in place; None: never (docs/console.md,
    # "Live updates").
    console_refresh: float | None = 5.0
    # ---- beyond one database (docs/scaling.md). The aliases holding the job tables when the
    # jobs are sharded by tenant, XJOBS["DATABASE"] (the home shard) first; () when they are
    # not. ``database`` is the alias in use: a view of these settings for another shard
    # (:func:`using_database`) differs from them in ``database`` and ``listen_database`` only.
    shards: tuple[str, ...] = ()
    # XJOBS["TENANT_SHARDS"]: tenant id -> alias, or the dotted path of a function of the tenant
    # id returning an alias (None: tenants not named, and jobs without a tenant, live on the
    # home shard). Read through :func:`shard_for_tenant`.
    tenant_shards: Mapping[str, str] | str | None = None
    # XJOBS["LISTEN_DATABASE"] per jobs alias (the dict form; a string names the home's).
    listen_databases: Mapping[str, str] = field(default_factory=dict)
    # XJOBS["READ_DATABASE"]: jobs alias -> the alias of its streaming replica, which serves the
    # console's and the metrics' reads while it is no further behind than READ_MAX_LAG
    # (replica.py; docs/scaling.md, "Reads on a replica").
    read_databases: Mapping[str, str] = field(default_factory=dict)
    read_max_lag: float = 30.0
    # XJOBS["DATABASE"] whatever alias this view is for.
    home_database: str = "default"

    @property
    def job_databases(self) -> tuple[str, ...]:
        """Every alias holding the job tables: the shards, or the one database."""
        return self.shards or (self.home_database,)

    @property
    def jobs_database(self) -> str:
        """The jobs alias in use; its primary's when this view reads its replica."""
        return next((primary for primary, replica in self.read_databases.items()
                     if replica == self.database), self.database)

    @property
    def read_database(self) -> str | None:
        """The replica of the alias in use, if one is set."""
        return self.read_databases.get(self.database)


    def route(self, name: str) -> str:
        """The queue of a job named ``name`` that named none: the first matching route's,
        else ``"default"``."""
        for pattern, queue in self.routes:
            if pattern.match(name):
                return queue
        return "default"


_KNOWN_KEYS = {
    "DATABASE", "QUEUES", "CONCURRENCY", "PREFETCH", "LEASE", "HEARTBEAT", "POLL_INTERVAL",
    "NOTIFY", "MAX_PAYLOAD_BYTES", "MAX_ATTEMPTS", "RETRY_BASE", "RETRY_CAP", "SHUTDOWN_GRACE",
    "UNKNOWN_JOB_RETRY_MAX", "UNKNOWN_JOB_REPORT_AFTER",
    "MAX_JOBS_PER_PROCESS", "MAX_MEMORY",  # worker recycling
    "ACK_BATCH", "ACK_INTERVAL", "RETENTION", "SCHEDULE", "APP_VERSION", "ADMIN_TENANT_SCOPE",
    "PREPARED_STATEMENTS", "WORKER_SEEN_INTERVAL", "LISTEN_DATABASE",
    "BACKFILL_THROTTLE",  # ---- backfills
    "OUTBOX",
    "CONCURRENCY_LIMITS", "SLOT_TTL",  # concurrency slots
    "TEST_MODE",  # django_xjobs.testing (docs/testing.md)
    "CONSOLE_REFRESH",  # the console's live updates (docs/console.md)
    "ROUTES",
    "SHARDS", "TENANT_SHARDS", "READ_DATABASE", "READ_MAX_LAG",  # docs/scaling.md
}
TEST_MODES = ("inline",)

_T = TypeVar("_T")
_P = ParamSpec("_P")


class _Problems:
    """What :func:`_parse` refused: one message per bad key (per entry of ``SCHEDULE``).

    :meth:`take` reads one key; when its value is refused it notes why and carries on with the
    key's default, so the keys after it are still judged and ``manage.py check`` lists every
    mistake at once (tests/integration/test_checks.py::
    test_manage_py_check_lists_every_bad_xjobs_key). A rule between keys is judged only when
    every key it involves was read (:meth:`read`): judged against the default of a refused key,
    it would report a mistake nobody made
    (tests/unit/test_conf.py::test_an_unreadable_key_is_not_also_blamed_on_the_keys_it_relates_to).
    """

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._refused: set[str] = set()

    def take(self, parse: Callable[Concatenate[Mapping[str, Any], str, _T, _P], _T],
             raw: Mapping[str, Any], key: str, default: _T, /,
             *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``parse(raw, key, default, ...)``, or ``default`` (and a problem) if it refuses."""
        try:
            return parse(raw, key, default, *args, **kwargs)
        except ConfigurationError as exc:
            self.refuse(str(exc), key)
            return default

    def refuse(self, message: str, *keys: str) -> None:
        self.messages.append(message)
        self._refused.update(keys)

    def read(self, *keys: str) -> bool:
        """Whether none of ``keys`` was refused (each was given and accepted, or left unset)."""
        return self._refused.isdisjoint(keys)


def _positive_int(raw: Mapping[str, Any], key: str, default: int, *, where: str = "") -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        name = where or f'XJOBS["{key}"]'
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
    return value


def _duration(raw: Mapping[str, Any], key: str, default: float, *, positive: bool = True) -> float:
    seconds = parse_duration(raw.get(key, default), what=f'XJOBS["{key}"]')
    if positive and seconds <= 0:
        raise ConfigurationError(f'XJOBS["{key}"] must be greater than zero')
    return seconds


def _bool(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigurationError(f'XJOBS["{key}"] must be True or False, got {value!r}')
    return value


def _database(raw: Mapping[str, Any], key: str, default: str) -> str:
    database = raw.get(key, default)
    if not isinstance(database, str) or not database:
        raise ConfigurationError(f'XJOBS["{key}"] must be a database alias, got {database!r}')
    return database


def _per_database(raw: Mapping[str, Any], key: str, default: Mapping[str, str],
                  home: str) -> Mapping[str, str]:
    """``XJOBS["LISTEN_DATABASE"]`` / ``["READ_DATABASE"]``: an alias for the home database,
    or a dict of jobs alias -> alias; read as the dict. None: none."""
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, str):
        return {home: _database(raw, key, "")}
    if not isinstance(value, Mapping) or not value:
        raise ConfigurationError(
            f'XJOBS["{key}"] must be a database alias, or a dict of jobs alias -> alias like'
            f' {{"jobs_eu": "jobs_eu_{key.split("_")[0].lower()}"}}, got {value!r}')
    for jobs_alias, alias in value.items():
        if not isinstance(jobs_alias, str) or not isinstance(alias, str) or not alias:
            raise ConfigurationError(
                f'XJOBS["{key}"]: {jobs_alias!r}: {alias!r} must map a jobs alias to an alias')
    return dict(value)


def _shards(raw: Mapping[str, Any], key: str, default: tuple[str, ...],
            home: str) -> tuple[str, ...]:
    """``XJOBS["SHARDS"]``: the aliases holding the job tables, the home one among them."""
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        raise ConfigurationError(
            f'XJOBS["SHARDS"] must be a list of database aliases like ["{home}", "jobs_2"],'
            f' got {value!r}')
    for alias in value:
        if not isinstance(alias, str) or not alias:
            raise ConfigurationError(f'XJOBS["SHARDS"]: {alias!r} is not a database alias')
    if len(set(value)) != len(value):
        raise ConfigurationError(f'XJOBS["SHARDS"] repeats an alias: {list(value)!r}')
    if home not in value:
        raise ConfigurationError(
            f'XJOBS["SHARDS"] must list XJOBS["DATABASE"] ({home!r}), the home shard: jobs'
            " without a tenant, and tenants no rule places, live there")
    return (home, *(alias for alias in value if alias != home))


def _tenant_shards(raw: Mapping[str, Any], key: str, default: Mapping[str, str] | str | None,
                   shards: tuple[str, ...]) -> Mapping[str, str] | str | None:
    """``XJOBS["TENANT_SHARDS"]``: a dict of tenant id -> shard alias, or the dotted path of
    a function of the tenant id."""
    value = raw.get(key)
    if value is None:
        return None
    if not shards:
        raise ConfigurationError('XJOBS["TENANT_SHARDS"] needs XJOBS["SHARDS"], the aliases'
                                 " the tenants are placed on")
    if isinstance(value, str):
        if "." not in value:
            raise ConfigurationError(
                f'XJOBS["TENANT_SHARDS"] must be a dict or a dotted path like '
                f'"myproject.sharding.shard_of", got {value!r}')
        return value
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            'XJOBS["TENANT_SHARDS"] must be a dict of tenant id -> shard alias, or the dotted'
            f' path of a function of the tenant id, got {value!r}')
    for tenant, alias in value.items():
        if not isinstance(tenant, str) or alias not in shards:
            raise ConfigurationError(
                f'XJOBS["TENANT_SHARDS"]: tenant {tenant!r} -> {alias!r}: tenant ids are'
                f' strings and the alias must be one of XJOBS["SHARDS"] {list(shards)}')
    return dict(value)


QueueOptions = tuple[tuple[str, ...], Mapping[str, int], frozenset[str],
                     Mapping[str, Mapping[str, int]]]
_QUEUE_KEYS = {"concurrency", "fair_by", "weights"}


def _queues(raw: Mapping[str, Any], key: str, default: QueueOptions) -> QueueOptions:
    """``XJOBS["QUEUES"]``: the queue names, and for the dict form each queue's concurrency,
    whether it is shared fairly between tenants, and their weights."""
    queues_raw = raw.get(key, list(default[0]))
    if isinstance(queues_raw, str) or not isinstance(queues_raw, list | tuple | Mapping):
        raise ConfigurationError(
            'XJOBS["QUEUES"] must be a list of queue names or a dict like'
            ' {"emails": {"concurrency": 4}}'
        )
    queues = tuple(queues_raw)
    if not queues:
        raise ConfigurationError('XJOBS["QUEUES"] must name at least one queue')
    queue_concurrency: dict[str, int] = {}
    fair: set[str] = set()
    weights: dict[str, dict[str, int]] = {}
    for q in queues:
        if not isinstance(q, str) or not NAME_RE.match(q):
            raise ConfigurationError(
                f'XJOBS["QUEUES"]: {q!r} is not a valid queue name ([A-Za-z0-9_.:-]{{1,200}})'
            )
        if not isinstance(queues_raw, Mapping):
            continue
        options = queues_raw[q] or {}
        where = f'XJOBS["QUEUES"]["{q}"]'
        if not isinstance(options, Mapping) or set(options) - _QUEUE_KEYS:
            raise ConfigurationError(
                f'{where} must be a dict with optional keys "concurrency", "fair_by" '
                f'("tenant") and "weights" ({{tenant: weight}})'
            )
        if "concurrency" in options:
            queue_concurrency[q] = _positive_int(options, "concurrency", 1,
                                                 where=f'{where}["concurrency"]')
        fair_by = options.get("fair_by")
        if fair_by not in (None, "tenant"):
            raise ConfigurationError(f'{where}["fair_by"] must be "tenant" or None, got '
                                     f'{fair_by!r:.40}')
        if fair_by == "tenant":
            fair.add(q)
        given = options.get("weights")
        if given is not None:
            if fair_by != "tenant":
                raise ConfigurationError(f'{where}["weights"] needs {where}["fair_by"] = '
                                         '"tenant"')
            if not isinstance(given, Mapping):
                raise ConfigurationError(f'{where}["weights"] must be a dict of tenant -> '
                                         f'weight, got {given!r:.60}')
            for tenant, weight in given.items():
                if not isinstance(tenant, str) or isinstance(weight, bool) or not isinstance(
                        weight, int) or not 1 <= weight <= 1000:
                    raise ConfigurationError(
                        f'{where}["weights"]: {tenant!r:.40}: {weight!r:.20} must be a tenant '
                        'id (a string; "" for jobs without a tenant) with a whole weight from 1 '
                        'to 1000')
            weights[q] = dict(given)
    return queues, queue_concurrency, frozenset(fair), weights


def _retention(
    raw: Mapping[str, Any], key: str, default: Mapping[str, float]
) -> Mapping[str, float]:
    retention_raw = raw.get(key, {})
    if not isinstance(retention_raw, Mapping):
        raise ConfigurationError('XJOBS["RETENTION"] must be a dict like {"done": "7d"}')
    retention = dict(default)
    for state, value in retention_raw.items():
        if state not in DEFAULT_RETENTION:
            raise ConfigurationError(
                f'XJOBS["RETENTION"]: {state!r} is not a finished state (done, dead, cancelled)'
            )
        retention[state] = parse_duration(value, what=f'XJOBS["RETENTION"]["{state}"]')
    return retention


def _recycle_after(raw: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """``XJOBS["MAX_JOBS_PER_PROCESS"]``: None (never), or a positive integer."""
    if raw.get(key, default) is None:
        return None
    return _positive_int(raw, key, 1)


def _max_memory(raw: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """``XJOBS["MAX_MEMORY"]``: None (no bound), or MiB: ``512``, ``"512MiB"``, ``"1GiB"``."""
    value = raw.get(key, default)
    if value is None:
        return None
    return parse_mebibytes(value, what=f'XJOBS["{key}"]')


def _prefetch(raw: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """``"auto"`` is None: sized to the observed run time (worker/capacity.py)."""
    prefetch = raw.get(key, "auto")
    if prefetch == "auto":
        return None
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ConfigurationError(
            f'XJOBS["PREFETCH"] must be "auto" or an integer >= 0, got {prefetch!r}'
        )
    return prefetch


def _app_version(raw: Mapping[str, Any], key: str, default: str | None) -> str | None:
    app_version = raw.get(key, default)
    if app_version is not None and not isinstance(app_version, str):
        raise ConfigurationError('XJOBS["APP_VERSION"] must be a string')
    return app_version


def _tenant_scope(raw: Mapping[str, Any], key: str, default: str | None) -> str | None:
    """The dotted path; a callable is read from ``raw`` where it is used
    (console/reads/scope.py)."""
    scope = raw.get(key, default)
    if scope is not None and not (isinstance(scope, str) or callable(scope)):
        raise ConfigurationError('XJOBS["ADMIN_TENANT_SCOPE"] must be a dotted path or callable')
    return scope if isinstance(scope, str) else None


def _console_refresh(raw: Mapping[str, Any], key: str, default: float | None) -> float | None:
    """``XJOBS["CONSOLE_REFRESH"]``: how often an open console page updates in place, from 1 s
    to 1 h; None turns live updates off (docs/console.md, "Live updates")."""
    value = raw.get(key, default)
    if value is None:
        return None
    seconds = parse_duration(value, what=f'XJOBS["{key}"]')
    if not 1 <= seconds <= 3600:
        raise ConfigurationError(
            f'XJOBS["{key}"] must be from 1s to 1h (None turns the console\'s live updates '
            f"off), got {value!r}")
    return seconds


def _test_mode(raw: Mapping[str, Any], key: str, default: str | None) -> str | None:
    test_mode = raw.get(key, default)
    if test_mode is not None and test_mode not in TEST_MODES:
        raise ConfigurationError(
            f'XJOBS["TEST_MODE"] must be "inline" (run each job at enqueue, for tests) or None,'
            f" got {test_mode!r}"
        )
    return test_mode


def validate(raw: Mapping[str, Any] | None) -> list[str]:
    """Every problem of an ``XJOBS`` dict, one message per bad key; empty when it is good.

    The system check reports each as its own ``xjobs.E001`` (checks.py).
    """
    return _parse(raw)[1]


def build(raw: Mapping[str, Any] | None) -> XJobsSettings:
    """Parse an ``XJOBS`` dict; raise :class:`ConfigurationError` naming every bad key (one line
    each)."""
    settings, problems = _parse(raw)
    if settings is None:
        raise ConfigurationError("\n".join(problems))
    return settings


def _parse(raw: Mapping[str, Any] | None) -> tuple[XJobsSettings | None, list[str]]:
    """The settings, or None and every problem found."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return None, [f"XJOBS must be a dict, got {type(raw).__name__}: {raw!r:.80}"]
    raw = dict(raw)
    problems = _Problems()
    take = problems.take
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        problems.refuse(f"XJOBS has unknown key(s) {unknown}; known keys: {sorted(_KNOWN_KEYS)}")
    queues, queue_concurrency, fair_queues, queue_weights = take(
        _queues, raw, "QUEUES", (("default",), {}, frozenset(), {}))
    lease = take(_duration, raw, "LEASE", 30.0)
    heartbeat = take(_duration, raw, "HEARTBEAT", default_heartbeat(lease))
    if problems.read("LEASE", "HEARTBEAT") and lease < 3 * heartbeat:
        problems.refuse(
            f'XJOBS["LEASE"] ({lease:g}s) must be at least 3 x XJOBS["HEARTBEAT"] ({heartbeat:g}s):'
            " with fewer renewals per lease, one slow heartbeat lets the lease lapse while the"
            " job still runs, and another worker starts it a second time",
            "LEASE", "HEARTBEAT",
        )
    retry_base = take(_duration, raw, "RETRY_BASE", 2.0)
    retry_cap = take(_duration, raw, "RETRY_CAP", 3600.0)
    if problems.read("RETRY_BASE", "RETRY_CAP") and retry_cap < retry_base:
        problems.refuse('XJOBS["RETRY_CAP"] must not be smaller than XJOBS["RETRY_BASE"]',
                        "RETRY_CAP")
    poll_interval = take(_duration, raw, "POLL_INTERVAL", 1.0)
    database = take(_database, raw, "DATABASE", "default")
    shards = take(_shards, raw, "SHARDS", (), database)
    listen_databases = take(_per_database, raw, "LISTEN_DATABASE", {}, database)
    read_databases = take(_per_database, raw, "READ_DATABASE", {}, database)
    for key, per_alias in (("LISTEN_DATABASE", listen_databases),
                           ("READ_DATABASE", read_databases)):
        strays = sorted(set(per_alias) - set(shards or (database,)))
        if strays and problems.read("SHARDS", "DATABASE"):
            problems.refuse(f'XJOBS["{key}"] names {strays}, which hold no job tables'
                            f' (XJOBS["DATABASE"] and XJOBS["SHARDS"] do)', key)
    settings = XJobsSettings(
        database=database,
        home_database=database,
        shards=shards,
        tenant_shards=take(_tenant_shards, raw, "TENANT_SHARDS", None, shards),
        listen_databases=listen_databases,
        read_databases=read_databases,
        read_max_lag=take(_duration, raw, "READ_MAX_LAG", 30.0),
        queues=queues,
        queues_given="QUEUES" in raw,
        queue_concurrency=queue_concurrency,
        fair_queues=fair_queues,
        queue_weights=queue_weights,
        concurrency=take(_positive_int, raw, "CONCURRENCY", 10),
        prefetch=take(_prefetch, raw, "PREFETCH", None),
        lease=lease,
        heartbeat=heartbeat,
        poll_interval=poll_interval,
        worker_seen_interval=take(_duration, raw, "WORKER_SEEN_INTERVAL", 10.0),
        notify=take(_bool, raw, "NOTIFY", True),
        prepared_statements=take(_bool, raw, "PREPARED_STATEMENTS", True),
        listen_database=listen_databases.get(database),
        max_payload_bytes=take(_positive_int, raw, "MAX_PAYLOAD_BYTES", 1024 * 1024),
        max_attempts=take(_positive_int, raw, "MAX_ATTEMPTS", 3),
        retry_base=retry_base,
        retry_cap=retry_cap,
        unknown_job_retry_max=take(_duration, raw, "UNKNOWN_JOB_RETRY_MAX", 60.0),
        unknown_job_report_after=take(_duration, raw, "UNKNOWN_JOB_REPORT_AFTER", 600.0),
        shutdown_grace=take(_duration, raw, "SHUTDOWN_GRACE", 30.0, positive=False),
        max_jobs_per_process=take(_recycle_after, raw, "MAX_JOBS_PER_PROCESS", None),
        max_memory=take(_max_memory, raw, "MAX_MEMORY", None),
        ack_batch=take(_positive_int, raw, "ACK_BATCH", 500),
        ack_interval=take(_duration, raw, "ACK_INTERVAL", 0.005, positive=False),
        retention=take(_retention, raw, "RETENTION", DEFAULT_RETENTION),
        app_version=take(_app_version, raw, "APP_VERSION", None),
        admin_tenant_scope=take(_tenant_scope, raw, "ADMIN_TENANT_SCOPE", None),
        backfill_throttle=take(_duration, raw, "BACKFILL_THROTTLE", 0.0,  # ---- backfills
                               positive=False),
        routes=take(_routes, raw, "ROUTES", ()),
        raw=raw,
        outbox=take(_outbox_settings, raw, "OUTBOX", OutboxSettings(poll_interval=poll_interval)),
        test_mode=take(_test_mode, raw, "TEST_MODE", None),
        console_refresh=take(_console_refresh, raw, "CONSOLE_REFRESH", 5.0),
        **_slot_settings(raw, problems, lease=lease, heartbeat=heartbeat),
        **_scheduler_settings(raw, problems, lease),
    )
    if problems.messages:
        return None, problems.messages
    return settings, []


# ------------------------------------------------------------------------ concurrency slots --

MAX_SLOT_KEY = 500  # characters of a concurrency key (and so of a CONCURRENCY_LIMITS prefix)

# The concurrency key of every debounced job starts with it (slots.debounce_key), and such a key
# has the limit 1 whatever CONCURRENCY_LIMITS says: slots.limit_for on the worker's side, the
# claim's key_limit_sql (engines/postgres/statements/fragments.py) on the database's. It lives
# here, below both: the statements import no service (pyproject.toml's import contracts).
DEBOUNCE_PREFIX = "debounce:"


def _concurrency_limits(
    raw: Mapping[str, Any], key: str, default: tuple[tuple[str, int], ...]
) -> tuple[tuple[str, int], ...]:
    limits_raw = raw.get(key, dict(default))
    if not isinstance(limits_raw, Mapping):
        raise ConfigurationError(
            'XJOBS["CONCURRENCY_LIMITS"] must be a dict of key prefix -> limit, like'
            ' {"tenant:": 5}'
        )
    limits: list[tuple[str, int]] = []
    for prefix in limits_raw:
        if not isinstance(prefix, str) or len(prefix) > MAX_SLOT_KEY or "\x00" in prefix:
            raise ConfigurationError(
                f'XJOBS["CONCURRENCY_LIMITS"]: the prefix {prefix!r:.80} must be a string of at'
                f" most {MAX_SLOT_KEY} characters without NUL"
            )
        limits.append((prefix, _positive_int(
            limits_raw, prefix, 1, where=f'XJOBS["CONCURRENCY_LIMITS"][{prefix!r}]'
        )))
    limits.sort(key=lambda item: -len(item[0]))
    return tuple(limits)


def _slot_settings(raw: Mapping[str, Any], problems: _Problems, *, lease: float,
                   heartbeat: float) -> dict[str, Any]:
    """XJOBS["CONCURRENCY_LIMITS"] and XJOBS["SLOT_TTL"]."""
    slot_ttl = problems.take(_duration, raw, "SLOT_TTL", lease)
    if (problems.read("SLOT_TTL", "LEASE", "HEARTBEAT")
            and slot_ttl < 3 * heartbeat - 1e-9):  # 0.6 s is 3 x 0.2 s, whatever floats say
        problems.refuse(
            f'XJOBS["SLOT_TTL"] ({slot_ttl:g}s) must be at least 3 x XJOBS["HEARTBEAT"]'
            f" ({heartbeat:g}s): slots are renewed with the heartbeat, and with fewer renewals"
            " per TTL one slow round lets a held slot lapse, so another run takes it while this"
            " one still runs",
            "SLOT_TTL",
        )
    return {"concurrency_limits": problems.take(_concurrency_limits, raw, "CONCURRENCY_LIMITS",
                                                ()),
            "slot_ttl": slot_ttl}



# ------------------------------------------------------------------------------ scheduler --
# The cron scheduler, its leader election and the maintenance duty (django_xjobs/scheduler/,
# django_xjobs/maintenance/; docs/scheduling.md). Shapes are judged here; cron expressions,
# timezones and job names are judged by the system checks (checks.py), which know the job
# registry.

_SCHEDULER_KEYS = {
    "LEADER", "LEADER_LEASE", "LEADER_RENEW", "CRON_MISFIRE_GRACE", "CRON_MAX_CATCHUP",
    "MAINTENANCE_INTERVAL", "MAINTENANCE_BATCH", "OUTBOX_RETENTION", "SLOT_PURGE_GRACE",
    "ARCHIVE_AFTER",
}
_KNOWN_KEYS.update(_SCHEDULER_KEYS)
LEADER_MODES = ("lease", "advisory")
SCHEDULE_ENTRY_KEYS = {"job", "cron", "every", "timezone", "input", "args", "misfire", "overlap",
                       "queue", "priority"}
# What an occurrence does while an earlier run of its task is still live (docs/scheduling.md,
# "Overlap"), for @job(overlap=...) and a SCHEDULE entry's "overlap"; the first is the default.
OVERLAP_POLICIES = ("allow", "skip", "buffer_one", "cancel_previous")


def parse_overlap(value: object, *, what: str) -> str:
    """A cron task's overlap policy (docs/scheduling.md, "Overlap"), from ``@job(overlap=...)``
    or a schedule entry; ``what`` names where it was given."""
    if not isinstance(value, str) or value not in OVERLAP_POLICIES:
        raise ConfigurationError(
            f"{what} must be one of {', '.join(repr(p) for p in OVERLAP_POLICIES)}, "
            f"got {type(value).__name__} {value!r:.80}"
        )
    return value


def _schedule(raw: Mapping[str, Any], problems: _Problems) -> dict[str, dict[str, Any]]:
    """``XJOBS["SCHEDULE"]``: task name -> {"job", "cron" or "every", "timezone", "input",
    "args", "misfire", "overlap", "queue", "priority"}, every key present (None: not given).

    Each entry is a task of its own: every bad one is reported, and the good ones are kept."""
    schedule = raw.get("SCHEDULE", {})
    if not isinstance(schedule, Mapping):
        problems.refuse(
            'XJOBS["SCHEDULE"] must be a dict of task name -> options, like {"nightly": '
            '{"job": "app.fn", "cron": "0 3 * * *"}}',
            "SCHEDULE",
        )
        return {}
    entries: dict[str, dict[str, Any]] = {}
    for task, entry in schedule.items():
        try:
            entries[task] = _schedule_entry(task, entry)
        except ConfigurationError as exc:
            problems.refuse(str(exc), "SCHEDULE")
    return entries


def _schedule_entry(task: Any, entry: Any) -> dict[str, Any]:
    where = f'XJOBS["SCHEDULE"][{task!r}]'
    if not isinstance(task, str) or not NAME_RE.match(task):
        raise ConfigurationError(
            f'XJOBS["SCHEDULE"]: task name {task!r} is not valid: use 1-200 characters '
            "from [A-Za-z0-9_.:-]"
        )
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f'{where} must be a dict with "job" and "cron" (or "every")')
    unknown = sorted(set(entry) - SCHEDULE_ENTRY_KEYS, key=str)
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s) {unknown}; known: {sorted(SCHEDULE_ENTRY_KEYS)}"
        )
    if "job" not in entry:
        raise ConfigurationError(f'{where} needs a "job"')
    job = entry["job"]
    if not isinstance(job, str) or not NAME_RE.match(job):
        raise ConfigurationError(f'{where}["job"] must be a registered job name, got {job!r}')
    cron, every, timezone = _schedule_when(where, entry)
    input_ = keyword_input(entry.get("input", {}), f'{where}["input"]', error=ConfigurationError)
    # Positional arguments: mapped onto the job's parameters by scheduler/schedule.py, once the
    # registry knows the job (a settings module is read before any jobs.py is imported).
    args = entry.get("args", ())
    if not isinstance(args, list | tuple):
        raise ConfigurationError(
            f'{where}["args"] must be a list of positional arguments, got {args!r:.80}'
        )
    queue = entry.get("queue")
    if queue is not None:
        check_name(f'{where}["queue"]: queue name', queue, error=ConfigurationError)
    priority = entry.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or abs(priority) > 2**31 - 1):
        raise ConfigurationError(
            f'{where}["priority"] must be a 32-bit integer (higher runs first), got {priority!r}'
        )
    misfire = entry.get("misfire", "latest")
    if misfire not in ("latest", "all", "skip"):
        raise ConfigurationError(
            f'{where}["misfire"] must be "latest", "all" or "skip", got {misfire!r}'
        )
    overlap = parse_overlap(entry.get("overlap", "allow"), what=f'{where}["overlap"]')
    return {"job": job, "cron": cron, "every": every, "timezone": timezone,
            "input": dict(input_), "args": list(args), "misfire": misfire, "overlap": overlap,
            "queue": queue, "priority": priority}


def _schedule_when(where: str, entry: Mapping[str, Any]
                   ) -> tuple[str | None, float | None, str | None]:
    """A schedule entry's ``cron`` (with its ``timezone``, default UTC) or ``every`` (seconds;
    no timezone): exactly one of them. The expression and the interval's range are judged by
    the system checks (scheduler/schedule.py), the shapes here."""
    if ("cron" in entry) == ("every" in entry):
        raise ConfigurationError(
            f'{where} needs a "cron" or an "every" (a cron expression, or an interval such as '
            '"45s"), one of them' + (", not both" if "cron" in entry else "")
        )
    if "every" in entry:
        if "timezone" in entry:
            raise ConfigurationError(
                f'{where}["timezone"] goes with "cron" only: an interval ("every") counts real '
                "seconds from the Unix epoch, which no timezone moves"
            )
        return None, parse_duration(entry["every"], what=f'{where}["every"]'), None
    cron = entry["cron"]
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigurationError(
            f'{where}["cron"] must be a cron expression string, got {cron!r}'
        )
    timezone = entry.get("timezone", "UTC")
    if not isinstance(timezone, str) or not timezone:
        raise ConfigurationError(
            f'{where}["timezone"] must be an IANA timezone name, got {timezone!r}'
        )
    return cron, None, timezone


def _routes(raw: Mapping[str, Any], key: str,
            default: tuple[tuple[re.Pattern[str], str], ...]
            ) -> tuple[tuple[re.Pattern[str], str], ...]:
    """``XJOBS["ROUTES"]``: job-name pattern -> queue, a shell-style glob (``*``, ``?``,
    ``[...]``, as Celery's ``task_routes`` takes them) to a queue name, or to ``{"queue":
    name}`` (Celery's form of a route)."""
    routes = raw.get(key)
    if routes is None:
        return default
    if not isinstance(routes, Mapping):
        raise ConfigurationError(
            f'XJOBS["ROUTES"] must be a dict of job-name pattern -> queue, like '
            f'{{"emails.*": "mail"}}, got {type(routes).__name__}')
    compiled = []
    for pattern, target in routes.items():
        where = f'XJOBS["ROUTES"][{pattern!r}]'
        if not isinstance(pattern, str) or not pattern:
            raise ConfigurationError(f"{where}: a pattern must be a non-empty string")
        if isinstance(target, Mapping):
            extra = set(target) - {"queue"}
            if "queue" not in target or extra:
                raise ConfigurationError(
                    f'{where} must be a queue name or {{"queue": name}}, got {target!r:.80}'
                    + (f" (only the queue is routed here; {sorted(extra)} are not)"
                       if extra else ""))
            target = target["queue"]
        check_name(f"{where}: queue", target, error=ConfigurationError)
        compiled.append((re.compile(fnmatch.translate(pattern)), target))
    return tuple(compiled)


def _leader(raw: Mapping[str, Any], key: str, default: str) -> str:
    leader = raw.get(key, default)
    if leader not in LEADER_MODES:
        raise ConfigurationError(
            f'XJOBS["LEADER"] must be "lease" (safe behind a connection pooler) or "advisory" '
            f"(a session lock on a dedicated connection), got {leader!r}"
        )
    return str(leader)


def _duration_or_none(raw: Mapping[str, Any], key: str, default: float | None, *,
                      positive: bool = True) -> float | None:
    """A duration that None switches off: ``MAINTENANCE_INTERVAL`` (no maintenance by the
    scheduler: ``manage.py xjobs maintenance`` instead), ``ARCHIVE_AFTER`` (finished jobs stay
    in x_jobs; retention then deletes them row by row)."""
    value = raw.get(key, default)
    if value is None:
        return None
    return _duration(raw, key, value, positive=positive)


def _scheduler_settings(raw: Mapping[str, Any], problems: _Problems,
                        worker_lease: float) -> dict[str, Any]:
    take = problems.take
    leader_lease = take(_duration, raw, "LEADER_LEASE", 15.0)
    leader_renew = take(_duration, raw, "LEADER_RENEW", leader_lease / 3)
    if problems.read("LEADER_LEASE", "LEADER_RENEW") and leader_lease < 3 * leader_renew:
        problems.refuse(
            f'XJOBS["LEADER_LEASE"] ({leader_lease:g}s) must be at least 3 x '
            f'XJOBS["LEADER_RENEW"] ({leader_renew:g}s): a leader stops acting once less than '
            "one renewal interval of its lease is left, so with fewer renewals per lease one "
            "slow renewal costs the leadership",
            "LEADER_LEASE", "LEADER_RENEW",
        )
    return {
        "schedule": _schedule(raw, problems),
        "leader": take(_leader, raw, "LEADER", "lease"),
        "leader_lease": leader_lease,
        "leader_renew": leader_renew,
        "cron_misfire_grace": take(_duration, raw, "CRON_MISFIRE_GRACE",
                                   leader_lease + leader_renew, positive=False),
        "cron_max_catchup": take(_positive_int, raw, "CRON_MAX_CATCHUP", 100),
        "maintenance_interval": take(_duration_or_none, raw, "MAINTENANCE_INTERVAL", 60.0),
        "maintenance_batch": take(_positive_int, raw, "MAINTENANCE_BATCH", 1000),
        "archive_after": take(_duration_or_none, raw, "ARCHIVE_AFTER", 10.0, positive=False),
        "outbox_retention": take(_duration, raw, "OUTBOX_RETENTION", 86400.0, positive=False),
        "slot_purge_grace": take(_duration, raw, "SLOT_PURGE_GRACE", worker_lease,
                                 positive=False),
    }


_cache: tuple[int, XJobsSettings] | None = None
# The jobs alias in use when it is not XJOBS["DATABASE"]: a shard (or its replica) chosen for
# this context by using_database(), else the one a worker process serves (pin_database()).
_active: ContextVar[str | None] = ContextVar("django_xjobs_database", default=None)
_pinned: str | None = None
_views: dict[tuple[int, str], XJobsSettings] = {}


def get() -> XJobsSettings:
    """The current settings, re-read whenever ``settings.XJOBS`` is replaced (override_settings),
    for the jobs alias in use (docs/scaling.md, "Sharding by tenant")."""
    global _cache
    raw = getattr(django_settings, "XJOBS", None)
    key = id(raw)
    cached = _cache
    if cached is None or cached[0] != key:
        cached = _cache = (key, build(raw))
    alias = _active.get() or _pinned
    if alias is None or alias == cached[1].database:
        return cached[1]
    view = _views.get((key, alias))
    if view is None:
        view = _views[(key, alias)] = _view(cached[1], alias)
    return view


def _view(base: XJobsSettings, alias: str) -> XJobsSettings:
    replicas = {replica: primary for primary, replica in base.read_databases.items()}
    if alias not in base.job_databases and alias not in replicas:
        raise ConfigurationError(
            f"database alias {alias!r} holds no job tables: XJOBS['DATABASE'] and "
            f"XJOBS['SHARDS'] name {list(base.job_databases)}"
            + (f", XJOBS['READ_DATABASE'] their replicas {sorted(replicas)}" if replicas
               else ""))
    return dataclasses.replace(base, database=alias,
                               listen_database=base.listen_databases.get(alias))


def check_database(alias: str) -> str:
    """``alias`` if it holds job tables (a shard, or the one database); ConfigurationError
    naming the ones that do otherwise."""
    get()  # the settings are valid
    base = _cache[1] if _cache is not None else build(None)
    if alias not in base.job_databases:
        _view(base, alias)  # a replica's alias passes here; anything else raises
    return alias


@contextmanager
def using_database(alias: str | None) -> Iterator[XJobsSettings]:
    """Within the block, the jobs alias in use in this context is ``alias`` (a shard, or the
    replica of one): ``get_engine()``, the router and every service go there. None: no change.
    """
    if alias is None:
        yield get()
        return
    check_database(alias)
    token = _active.set(alias)
    try:
        yield get()
    finally:
        _active.reset(token)


def pin_database(alias: str | None) -> None:
    """The jobs alias of this whole process, every thread (a worker serving one shard:
    ``xjobs_worker --shard``); None: XJOBS["DATABASE"] again."""
    global _pinned
    if alias is not None:
        check_database(alias)
    _pinned = alias


def shard_for_tenant(tenant_id: str | None) -> str:
    """The jobs alias of ``tenant_id``'s jobs: by XJOBS["TENANT_SHARDS"], the home database
    for a tenant it does not place and for no tenant. ConfigurationError when a function of the
    tenant returns an alias that is not a shard."""
    settings = get()
    rule = settings.tenant_shards
    if rule is None or tenant_id is None:
        return settings.home_database
    if isinstance(rule, str):
        alias = _tenant_function(rule)(tenant_id)
        if alias is None:
            return settings.home_database
        if alias not in settings.shards:
            raise ConfigurationError(
                f'XJOBS["TENANT_SHARDS"] ({rule}) placed tenant {tenant_id!r} on {alias!r},'
                f' which is not one of XJOBS["SHARDS"] {list(settings.shards)}')
        return str(alias)
    return rule.get(tenant_id, settings.home_database)


@functools.lru_cache(maxsize=8)
def _tenant_function(path: str) -> Callable[[str], Any]:
    try:
        function = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(f'XJOBS["TENANT_SHARDS"]: cannot import {path!r}: {exc}') from exc
    if not callable(function):
        raise ConfigurationError(f'XJOBS["TENANT_SHARDS"]: {path!r} is not callable')
    return function  # type: ignore[no-any-return]


def reset() -> None:
    global _cache
    _cache = None
    _views.clear()


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "XJOBS":
        reset()


def connect_signals() -> None:
    setting_changed.connect(_on_setting_changed, dispatch_uid="django_xjobs.conf")
