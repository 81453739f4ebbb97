"""Per-key concurrency slots: at most ``limit`` runs per key across the whole fleet
(docs/concurrency.md).

::

    @job(concurrency=Concurrency(key="tenant:{tenant_id}", limit=2))
    def sync_account(ctx, account_id: int) -> None: ...

    sync_account.using(tenant_id="acme").enqueue(account_id=7)       # key "tenant:acme"
    sync_account.using(concurrency_key="tenant:big").enqueue(...)   # an explicit key

The protocol. The database (``x_job_leases``, unique on ``(lease_key, slot)``) is authoritative
for who holds a slot; a worker only ever *believes* it holds one, and its belief is made to end
before the database's record does.

States of one slot ``(key, n)``, ``0 <= n < limit``::

    free ──acquire──▶ held by H ──renew (H, live)──▶ held by H, later expiry
     ▲  ◀──release (H)──┘  │  │
     └────────expiry───────┘  └─hand-over (H)──▶ held by H' (the key's next job)
                               (expires_at <= now(): H crashed, froze or hung)

* **free**: no row, or a row whose ``expires_at`` has passed (a lapsed row is free, whoever
  it names; maintenance deletes such rows later, this module never does).
* **acquire** (in ``jobs_claim`` itself; ``slots_acquire`` is the same step on its own): the
  lowest free slot under the limit, in the claim's ONE statement for every keyed job of the
  batch. The unique index serialises two workers that picked the same slot; the loser's ``on
  conflict do update`` only fires on an expired row, so a live slot is never granted twice. A
  job that gets no slot is not claimed: it becomes ``blocked`` on its key (no attempt spent).
* **renew** (``slots_renew_if_held``, one statement per heartbeat round, only when the worker
  holds slots): fenced on the holder AND ``expires_at > now()``. A lapsed slot is NOT revived:
  from the moment it lapsed any worker may have taken it, so the run is stopped instead
  (``X_JOB_SLOT_LOST``: :class:`~django_xjobs.exceptions.SlotLost`).
* **release** (``slots_release_if_held``, with the settle of the run, batched): however the
  run ended (done, failed, snoozed, suspended by a step, timed out, handed back at shutdown,
  lost). The same statement hands each freed slot to the next job blocked on its key that
  the releasing worker can start itself (**hand-over**: the row is rewritten for the new run,
  under the lock the release holds, and the job is leased to that worker; no claim sees the
  slot free in between), and wakes the other jobs blocked on each released key, as many as it
  has free slots, and NOTIFYs their queues: any worker claims them at once. A crashed worker
  releases nothing: its slots free themselves at expiry, and ``jobs_unblock`` (each worker,
  once per poll interval) wakes the jobs blocked on a key that has room again.

A run's life with a slot (worker/flow.py; worker/watchdog.py stops it)::

    claim + acquire ─granted─▶ execute ─▶ settle (fenced write) ─▶ release + wake blocked
           │                      │
           │                      └─ renewal refused, or no renewal for a whole SLOT_TTL
           │                         ─▶ X_JOB_SLOT_LOST: run stopped, result discarded,
           │                            job re-queued (its attempt given back)
           └─no free slot─▶ not claimed: blocked on its key until a release (or
                            jobs_unblock) wakes it; no attempt spent

Timeouts, and which bounds which:

* ``XJOBS["SLOT_TTL"]`` (default: the lease) is how long a slot stays held without renewal:
  how long a crashed or frozen holder blocks it. It must be at least 3 x ``HEARTBEAT``, the
  renewal period.
* The worker's belief in a slot ends at ``sent_at + SLOT_TTL`` on its monotonic clock, where
  ``sent_at`` is when it SENT the acquire or the last renewal that landed; the database
  computed ``now() + SLOT_TTL`` at or after that moment, so the belief ends first. Past it, the
  run is stopped (the self-fence, for a hung connection) and an outcome it reports is replaced
  by ``X_JOB_SLOT_LOST`` (for a worker that was frozen and woke up after its slot was taken):
  a run that could not prove it still held its slot never writes its result.
* ``POLL_INTERVAL`` is how often each worker runs ``jobs_unblock``: the longest a blocked job
  waits when its key has room that no release announced (a crashed holder's slot lapsed).
* The job's own lease (``LEASE``) is independent: a slot lost does not lose the job, and a job
  lease lost stops the run as always (its slot is then released with its settle).

The holder of a slot is ``<job id>/<lease token>/<worker id>``. The lease token makes it unique
per run: a claim writes a fresh token that is never reused, so the stale run of a re-claimed job
and the run that replaced it never share a holder, and a job resumed after a durable sleep (a
new claim) takes a new slot under a new holder. The job id and the worker id are there for the
operator reading ``manage.py xjobs slots``.

Limits are the acquirer's: each run asks for a slot under the limit that applies to it, the
longest matching prefix of ``XJOBS["CONCURRENCY_LIMITS"]`` (operators change it without a
deploy), else its job's ``Concurrency(limit=...)``. Two jobs that share a key with different
limits each respect their own; a limit lowered while slots above it are held takes effect as
those runs end (renewal does not look at the limit, acquisition does).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import key_templates
from .conf import DEBOUNCE_PREFIX, MAX_SLOT_KEY
from .exceptions import SLOT_LOST, ConfigurationError, InvalidConcurrencyKey
from .key_templates import KeyTemplate
from .values import INT32

if TYPE_CHECKING:
    from .conf import XJobsSettings
    from .records import ClaimedJob
    from .registry import JobDefinition

__all__ = ["SLOT_LOST", "Concurrency"]

log = logging.getLogger("django_xjobs.slots")


@dataclass(frozen=True, slots=True)
class Concurrency:
    """At most ``limit`` runs at once, fleet-wide, per value of ``key``.

    ``key`` is a template formatted at enqueue from the job's input and its ``tenant_id``:
    ``"tenant:{tenant_id}"``, ``"export:{account_id}"``, or a constant (``"smtp"``: at most
    ``limit`` runs of this job at all). Fields are plain names (``{name}``; no attributes,
    indexes, conversions or format specs); a field's value must be a string, an integer, or a
    datetime, date, time, UUID or Decimal (written as ``str()`` writes it).

    ``limit`` may be left out when ``XJOBS["CONCURRENCY_LIMITS"]`` gives one for the key's
    prefix; a settings limit always wins over this one.
    """

    key: str
    limit: int | None = None
    _template: KeyTemplate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        template = KeyTemplate(self.key, what="concurrency key", owner="Concurrency",
                               error=InvalidConcurrencyKey)
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int)
            or not 1 <= self.limit <= INT32
        ):
            raise ConfigurationError(
                f"Concurrency(limit=...) must be an integer from 1 to {INT32} (or None to take "
                f'it from XJOBS["CONCURRENCY_LIMITS"]), got {self.limit!r}'
            )
        object.__setattr__(self, "_template", template)

    @property
    def fields(self) -> tuple[str, ...]:
        """The field names of the template, in order."""
        return self._template.fields

    @property
    def prefix(self) -> str:
        """The literal text before the first field: every key of this template starts with it."""
        return self._template.prefix

    def format(self, values: Mapping[str, Any], *, tenant_id: str | None = None,
               job: str = "job") -> str:
        """The key for one input; :class:`InvalidConcurrencyKey` naming the field otherwise."""
        return self._template.format(values, tenant_id=tenant_id, job=job)


def validate_key(key: Any, *, job: str = "job") -> str:
    """A concurrency key as stored (key_templates.validate_key)."""
    return key_templates.validate_key(key, job=job, what="concurrency key",
                                      error=InvalidConcurrencyKey)


def concurrency_of(definition: JobDefinition | None) -> Concurrency | None:
    if definition is None:
        return None
    value = definition.options.get("concurrency")
    return value if isinstance(value, Concurrency) else None


def settings_limit(key: str, settings: XJobsSettings) -> int | None:
    """The limit ``XJOBS["CONCURRENCY_LIMITS"]`` gives ``key``: its longest matching prefix."""
    for prefix, limit in settings.concurrency_limits:  # longest first (conf.py)
        if key.startswith(prefix):
            return limit
    return None


def limit_for(key: str, definition: JobDefinition | None,
              settings: XJobsSettings) -> int | None:
    """The limit a run of ``definition`` asks under: settings first, then the job's own. A
    debounce key (:func:`debounce_key`) is always 1, whatever the settings say: it exists to
    keep a follow-up run from starting before the run it follows ended."""
    if key.startswith(DEBOUNCE_PREFIX):
        return 1
    limit = settings_limit(key, settings)
    if limit is not None:
        return limit
    concurrency = concurrency_of(definition)
    return concurrency.limit if concurrency is not None else None


def holder(job: ClaimedJob, worker_id: str) -> str:
    """``<job id>/<lease token>/<worker id>``: unique per run (see the module docstring)."""
    return f"{job.id}/{job.lease_token}/{worker_id}"


def parse_holder(value: str) -> tuple[str, str, str]:
    """(job id, lease token, worker id) of a holder written by :func:`holder`."""
    job_id, _, rest = value.partition("/")
    token, _, worker = rest.partition("/")
    return job_id, token, worker


# ---------------------------------------------------------------------------- enqueue side --


@dataclass(frozen=True, slots=True)
class EnqueueKeys:
    """The concurrency key of each input of one enqueue call (built once per call by api.py)."""

    job: str
    fixed: str | None  # .using(concurrency_key=...): the same key for every input
    concurrency: Concurrency | None
    tenant_id: str | None
    settings: XJobsSettings

    def key(self, values: Mapping[str, Any]) -> str:
        if self.fixed is not None:
            return self.fixed
        assert self.concurrency is not None
        key = self.concurrency.format(values, tenant_id=self.tenant_id, job=self.job)
        if self.concurrency.limit is None and settings_limit(key, self.settings) is None:
            raise _no_limit(self.job, key)
        return key


def enqueue_keys(definition: JobDefinition, explicit: Any, tenant_id: str | None,
                 settings: XJobsSettings) -> EnqueueKeys | None:
    """How an enqueue of ``definition`` gets its keys; None when it has none (unlimited)."""
    concurrency = concurrency_of(definition)
    if explicit is None and concurrency is None:
        return None
    fixed = None
    if explicit is not None:
        fixed = validate_key(explicit, job=definition.name)
        if limit_for(fixed, definition, settings) is None:
            raise _no_limit(definition.name, fixed)
    return EnqueueKeys(job=definition.name, fixed=fixed, concurrency=concurrency,
                       tenant_id=tenant_id, settings=settings)


def _no_limit(job: str, key: str) -> InvalidConcurrencyKey:
    return InvalidConcurrencyKey(
        f"{job}: no concurrency limit applies to the key {key!r:.100}: give the job "
        f'@job(concurrency=Concurrency(key=..., limit=N)), or add a prefix of the key to '
        f'XJOBS["CONCURRENCY_LIMITS"]'
    )


# -------------------------------------------------------------------------------- debounce --


def debounce_key(name: str, tenant_id: str | None, idempotency_key: str) -> str:
    """The concurrency key every debounced job of ``(name, tenant, key)`` carries
    (docs/flow-control.md, "Debounce"): ``debounce:<name>:<tenant or ''>:<key>``, limit 1, so a
    follow-up enqueued while a run is under way starts only once that run released the slot.

    A key that would pass the 500 characters a concurrency key may have ends in the SHA-256 of
    the idempotency key instead (a name is at most 200 characters, a tenant 200).
    """
    key = f"{DEBOUNCE_PREFIX}{name}:{tenant_id or ''}:{idempotency_key}"
    if len(key) > MAX_SLOT_KEY:
        digest = hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()
        key = f"{DEBOUNCE_PREFIX}{name}:{tenant_id or ''}:sha256:{digest}"
    return key


# ------------------------------------------------------------------------- @job(concurrency=) --


def check_option(definition: JobDefinition) -> None:
    """Validate ``@job(concurrency=...)`` against the function it decorates
    (``registry.register_option``)."""
    value = definition.options.get("concurrency")
    if value is None:
        definition.options.pop("concurrency", None)
        return
    if not isinstance(value, Concurrency):
        raise ConfigurationError(
            f"{definition.name}: concurrency= takes a Concurrency(key=..., limit=...), got "
            f"{value!r:.80}"
        )
    value._template.check_parameters(definition.func, definition.name)
