"""Settings: the ``XJOBS`` dict, read into a frozen dataclass with documented defaults.

Every value has one place where it is parsed (here) and one place where it is judged
(``checks.py`` turns :func:`validate` problems into Django system-check errors, so a bad value
stops ``runserver``, ``migrate`` and ``xjobs_worker`` at startup with a message naming the key).

Durations accept seconds (int/float), a ``timedelta``, or a string such as ``"250ms"``, ``"30s"``,
``"5m"``, ``"2h"``, ``"7d"``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings

from .exceptions import ConfigurationError

# \Z, not $: `$` also matches before a trailing newline, and "default\n" is not "default".
NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}\Z")

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(value: Any, *, what: str = "duration") -> float:
    """Seconds from a number, a timedelta or a string like ``"30s"``. Negative is an error."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ConfigurationError(f"{what}: expected a duration, got {value!r}")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ConfigurationError(
                f"{what}: {value!r} is not a duration (use e.g. 250ms, 30s, 5m, 2h, 7d)"
            )
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ConfigurationError(f"{what}: expected a duration, got {value!r}")
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what}: must be a finite duration, got {value!r}")
    if seconds < 0:
        raise ConfigurationError(f"{what}: must not be negative, got {value!r}")
    return seconds


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


def _outbox_settings(raw: Mapping[str, Any], poll_interval: float) -> OutboxSettings:
    options = raw.get("OUTBOX", {})
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
    concurrency: int = 10
    # Claimed-but-not-started jobs a worker may hold beyond its running ones. A claim asks for
    # up to concurrency + prefetch minus what is in flight: bigger batches are fewer round trips.
    # None ("auto"): sized to the observed run time (worker/loop.py, PREFETCH_WINDOW).
    prefetch: int | None = None
    lease: float = 30.0
    heartbeat: float = 10.0
    poll_interval: float = 1.0
    notify: bool = True
    # Server-side binding with statements prepared once per connection. Turn off behind a
    # transaction pooler that cannot keep prepared statements (PgBouncer < 1.21, or
    # max_prepared_statements = 0).
    prepared_statements: bool = True
    max_payload_bytes: int = 1024 * 1024
    max_attempts: int = 3
    retry_base: float = 2.0
    retry_cap: float = 3600.0
    shutdown_grace: float = 30.0
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
    outbox_retention: float = 86400.0
    slot_purge_grace: float = 30.0
    # ---- tests: "inline" runs each job at enqueue, when its transaction commits (testing/).
    test_mode: str | None = None


_KNOWN_KEYS = {
    "DATABASE", "QUEUES", "CONCURRENCY", "PREFETCH", "LEASE", "HEARTBEAT", "POLL_INTERVAL",
    "NOTIFY", "MAX_PAYLOAD_BYTES", "MAX_ATTEMPTS", "RETRY_BASE", "RETRY_CAP", "SHUTDOWN_GRACE",
    "ACK_BATCH", "ACK_INTERVAL", "RETENTION", "SCHEDULE", "APP_VERSION", "ADMIN_TENANT_SCOPE",
    "PREPARED_STATEMENTS",
    "BACKFILL_THROTTLE",  # ---- backfills
    "OUTBOX",
    "CONCURRENCY_LIMITS", "SLOT_TTL",  # concurrency slots
    "TEST_MODE",  # django_xjobs.testing (docs/testing.md)
}
TEST_MODES = ("inline",)


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


def build(raw: Mapping[str, Any] | None) -> XJobsSettings:
    """Parse an ``XJOBS`` dict; raise :class:`ConfigurationError` naming the first bad key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"XJOBS must be a dict, got {type(raw).__name__}: {raw!r:.80}")
    raw = dict(raw)
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise ConfigurationError(
            f"XJOBS has unknown key(s) {unknown}; known keys: {sorted(_KNOWN_KEYS)}"
        )
    database = raw.get("DATABASE", "default")
    if not isinstance(database, str) or not database:
        raise ConfigurationError(f'XJOBS["DATABASE"] must be a database alias, got {database!r}')

    queues_raw = raw.get("QUEUES", ["default"])
    if isinstance(queues_raw, str) or not isinstance(queues_raw, list | tuple | Mapping):
        raise ConfigurationError(
            'XJOBS["QUEUES"] must be a list of queue names or a dict like'
            ' {"emails": {"concurrency": 4}}'
        )
    queues = tuple(queues_raw)
    if not queues:
        raise ConfigurationError('XJOBS["QUEUES"] must name at least one queue')
    queue_concurrency: dict[str, int] = {}
    for q in queues:
        if not isinstance(q, str) or not NAME_RE.match(q):
            raise ConfigurationError(
                f'XJOBS["QUEUES"]: {q!r} is not a valid queue name ([A-Za-z0-9_.:-]{{1,200}})'
            )
        if isinstance(queues_raw, Mapping):
            options = queues_raw[q] or {}
            if not isinstance(options, Mapping) or set(options) - {"concurrency"}:
                raise ConfigurationError(
                    f'XJOBS["QUEUES"]["{q}"] must be a dict with an optional "concurrency" key'
                )
            if "concurrency" in options:
                queue_concurrency[q] = _positive_int(
                    options, "concurrency", 1, where=f'XJOBS["QUEUES"]["{q}"]["concurrency"]'
                )

    lease = _duration(raw, "LEASE", 30.0)
    heartbeat = _duration(raw, "HEARTBEAT", min(10.0, lease / 3))
    if lease < 3 * heartbeat:
        raise ConfigurationError(
            f'XJOBS["LEASE"] ({lease:g}s) must be at least 3 x XJOBS["HEARTBEAT"] ({heartbeat:g}s):'
            " with fewer renewals per lease, one slow heartbeat lets the lease lapse while the"
            " job still runs, and another worker starts it a second time"
        )
    max_attempts = _positive_int(raw, "MAX_ATTEMPTS", 3)
    retention_raw = raw.get("RETENTION", {})
    if not isinstance(retention_raw, Mapping):
        raise ConfigurationError('XJOBS["RETENTION"] must be a dict like {"done": "7d"}')
    retention = dict(DEFAULT_RETENTION)
    for state, value in retention_raw.items():
        if state not in DEFAULT_RETENTION:
            raise ConfigurationError(
                f'XJOBS["RETENTION"]: {state!r} is not a finished state (done, dead, cancelled)'
            )
        retention[state] = parse_duration(value, what=f'XJOBS["RETENTION"]["{state}"]')
    notify = raw.get("NOTIFY", True)
    if not isinstance(notify, bool):
        raise ConfigurationError(f'XJOBS["NOTIFY"] must be True or False, got {notify!r}')
    prepared = raw.get("PREPARED_STATEMENTS", True)
    if not isinstance(prepared, bool):
        raise ConfigurationError(
            f'XJOBS["PREPARED_STATEMENTS"] must be True or False, got {prepared!r}'
        )
    retry_base = _duration(raw, "RETRY_BASE", 2.0)
    retry_cap = _duration(raw, "RETRY_CAP", 3600.0)
    if retry_cap < retry_base:
        raise ConfigurationError('XJOBS["RETRY_CAP"] must not be smaller than XJOBS["RETRY_BASE"]')
    prefetch = raw.get("PREFETCH", "auto")
    if prefetch == "auto":
        prefetch = None
    elif isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ConfigurationError(
            f'XJOBS["PREFETCH"] must be "auto" or an integer >= 0, got {prefetch!r}'
        )
    app_version = raw.get("APP_VERSION")
    if app_version is not None and not isinstance(app_version, str):
        raise ConfigurationError('XJOBS["APP_VERSION"] must be a string')
    scope = raw.get("ADMIN_TENANT_SCOPE")
    if scope is not None and not (isinstance(scope, str) or callable(scope)):
        raise ConfigurationError('XJOBS["ADMIN_TENANT_SCOPE"] must be a dotted path or callable')
    poll_interval = _duration(raw, "POLL_INTERVAL", 1.0)
    test_mode = raw.get("TEST_MODE")
    if test_mode is not None and test_mode not in TEST_MODES:
        raise ConfigurationError(
            f'XJOBS["TEST_MODE"] must be "inline" (run each job at enqueue, for tests) or None,'
            f" got {test_mode!r}"
        )
    return XJobsSettings(
        database=database,
        queues=queues,
        queues_given="QUEUES" in raw,
        queue_concurrency=queue_concurrency,
        concurrency=_positive_int(raw, "CONCURRENCY", 10),
        prefetch=prefetch,
        lease=lease,
        heartbeat=heartbeat,
        poll_interval=poll_interval,
        notify=notify,
        prepared_statements=prepared,
        max_payload_bytes=_positive_int(raw, "MAX_PAYLOAD_BYTES", 1024 * 1024),
        max_attempts=max_attempts,
        retry_base=retry_base,
        retry_cap=retry_cap,
        shutdown_grace=_duration(raw, "SHUTDOWN_GRACE", 30.0, positive=False),
        ack_batch=_positive_int(raw, "ACK_BATCH", 500),
        ack_interval=_duration(raw, "ACK_INTERVAL", 0.005, positive=False),
        retention=retention,
        app_version=app_version,
        admin_tenant_scope=scope if isinstance(scope, str) or scope is None else None,
        backfill_throttle=_duration(raw, "BACKFILL_THROTTLE", 0.0, positive=False),  # backfills
        raw=raw,
        outbox=_outbox_settings(raw, poll_interval),
        test_mode=test_mode,
        **_slot_settings(raw, lease=lease, heartbeat=heartbeat),
        **_scheduler_settings(raw, lease),
    )


# ------------------------------------------------------------------------ concurrency slots --

MAX_SLOT_KEY = 500  # characters of a concurrency key (and so of a CONCURRENCY_LIMITS prefix)


def _slot_settings(raw: Mapping[str, Any], *, lease: float, heartbeat: float) -> dict[str, Any]:
    """XJOBS["CONCURRENCY_LIMITS"] and XJOBS["SLOT_TTL"]."""
    limits_raw = raw.get("CONCURRENCY_LIMITS", {})
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
    slot_ttl = _duration(raw, "SLOT_TTL", lease)
    if slot_ttl < 3 * heartbeat - 1e-9:  # 0.6 s is 3 x 0.2 s, whatever floats say
        raise ConfigurationError(
            f'XJOBS["SLOT_TTL"] ({slot_ttl:g}s) must be at least 3 x XJOBS["HEARTBEAT"]'
            f" ({heartbeat:g}s): slots are renewed with the heartbeat, and with fewer renewals"
            " per TTL one slow round lets a held slot lapse, so another run takes it while this"
            " one still runs"
        )
    return {"concurrency_limits": tuple(limits), "slot_ttl": slot_ttl}



# ------------------------------------------------------------------------------ scheduler --
# The cron scheduler, its leader election and the maintenance duty (django_xjobs/scheduler/,
# django_xjobs/maintenance/; docs/scheduling.md). Shapes are judged here; cron expressions,
# timezones and job names are judged by the system checks (checks.py), which know the job
# registry.

_SCHEDULER_KEYS = {
    "LEADER", "LEADER_LEASE", "LEADER_RENEW", "CRON_MISFIRE_GRACE", "CRON_MAX_CATCHUP",
    "MAINTENANCE_INTERVAL", "MAINTENANCE_BATCH", "OUTBOX_RETENTION", "SLOT_PURGE_GRACE",
}
_KNOWN_KEYS.update(_SCHEDULER_KEYS)
LEADER_MODES = ("lease", "advisory")
SCHEDULE_ENTRY_KEYS = {"job", "cron", "timezone", "input", "misfire"}


def _schedule(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``XJOBS["SCHEDULE"]``: task name -> {"job", "cron", "timezone", "input", "misfire"}."""
    schedule = raw.get("SCHEDULE", {})
    if not isinstance(schedule, Mapping):
        raise ConfigurationError(
            'XJOBS["SCHEDULE"] must be a dict of task name -> options, like {"nightly": '
            '{"job": "app.fn", "cron": "0 3 * * *"}}'
        )
    entries: dict[str, dict[str, Any]] = {}
    for task, entry in schedule.items():
        where = f'XJOBS["SCHEDULE"][{task!r}]'
        if not isinstance(task, str) or not NAME_RE.match(task):
            raise ConfigurationError(
                f'XJOBS["SCHEDULE"]: task name {task!r} is not valid: use 1-200 characters '
                "from [A-Za-z0-9_.:-]"
            )
        if not isinstance(entry, Mapping):
            raise ConfigurationError(f'{where} must be a dict with "job" and "cron"')
        unknown = sorted(set(entry) - SCHEDULE_ENTRY_KEYS, key=str)
        if unknown:
            raise ConfigurationError(
                f"{where} has unknown key(s) {unknown}; known: {sorted(SCHEDULE_ENTRY_KEYS)}"
            )
        for required in ("job", "cron"):
            if required not in entry:
                raise ConfigurationError(f'{where} needs a "{required}"')
        job = entry["job"]
        if not isinstance(job, str) or not NAME_RE.match(job):
            raise ConfigurationError(f'{where}["job"] must be a registered job name, got {job!r}')
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
        input_ = entry.get("input", {})
        if input_ is None:
            input_ = {}
        if not isinstance(input_, Mapping):
            raise ConfigurationError(
                f'{where}["input"] must be a dict of the job\'s keyword arguments, '
                f"got {type(input_).__name__}"
            )
        misfire = entry.get("misfire", "latest")
        if misfire not in ("latest", "all", "skip"):
            raise ConfigurationError(
                f'{where}["misfire"] must be "latest", "all" or "skip", got {misfire!r}'
            )
        entries[task] = {"job": job, "cron": cron, "timezone": timezone,
                         "input": dict(input_), "misfire": misfire}
    return entries


def _scheduler_settings(raw: Mapping[str, Any], worker_lease: float) -> dict[str, Any]:
    leader = raw.get("LEADER", "lease")
    if leader not in LEADER_MODES:
        raise ConfigurationError(
            f'XJOBS["LEADER"] must be "lease" (safe behind a connection pooler) or "advisory" '
            f"(a session lock on a dedicated connection), got {leader!r}"
        )
    leader_lease = _duration(raw, "LEADER_LEASE", 15.0)
    leader_renew = _duration(raw, "LEADER_RENEW", leader_lease / 3)
    if leader_lease < 3 * leader_renew:
        raise ConfigurationError(
            f'XJOBS["LEADER_LEASE"] ({leader_lease:g}s) must be at least 3 x '
            f'XJOBS["LEADER_RENEW"] ({leader_renew:g}s): a leader stops acting once less than '
            "one renewal interval of its lease is left, so with fewer renewals per lease one "
            "slow renewal costs the leadership"
        )
    grace = _duration(raw, "CRON_MISFIRE_GRACE", leader_lease + leader_renew, positive=False)
    interval_raw = raw.get("MAINTENANCE_INTERVAL", 60.0)
    interval = None if interval_raw is None else _duration(raw, "MAINTENANCE_INTERVAL", 60.0)
    return {
        "schedule": _schedule(raw),
        "leader": leader,
        "leader_lease": leader_lease,
        "leader_renew": leader_renew,
        "cron_misfire_grace": grace,
        "cron_max_catchup": _positive_int(raw, "CRON_MAX_CATCHUP", 100),
        "maintenance_interval": interval,
        "maintenance_batch": _positive_int(raw, "MAINTENANCE_BATCH", 1000),
        "outbox_retention": _duration(raw, "OUTBOX_RETENTION", 86400.0, positive=False),
        "slot_purge_grace": _duration(raw, "SLOT_PURGE_GRACE", worker_lease, positive=False),
    }


_cache: tuple[int, XJobsSettings] | None = None


def get() -> XJobsSettings:
    """The current settings, re-read whenever ``settings.XJOBS`` is replaced (override_settings)."""
    global _cache
    raw = getattr(django_settings, "XJOBS", None)
    key = id(raw)
    cached = _cache
    if cached is not None and cached[0] == key:
        return cached[1]
    parsed = build(raw)
    _cache = (key, parsed)
    return parsed


def reset() -> None:
    global _cache
    _cache = None


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "XJOBS":
        reset()


def connect_signals() -> None:
    from django.core.signals import setting_changed

    setting_changed.connect(_on_setting_changed, dispatch_uid="django_xjobs.conf")
