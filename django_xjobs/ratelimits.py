"""Rate limits: at most ``limit`` units started per ``period``, fleet-wide, per key
(docs/flow-control.md, "Rate limits").

::

    @job(rate_limit=RateLimit(key="partner:{tenant_id}", limit=100, period=timedelta(minutes=1)))
    def call_partner(ctx, order_id: int) -> None: ...

    partner = RateLimit(key="partner:acme", limit=100, period=timedelta(minutes=1))
    if partner.try_acquire():          # a view spending the same budget as the jobs
        ...

The budget is exact over any window of ``period``: every grant is a row of ``x_rate_units``
(key, time, cost), and ``xjobs_rate_take`` (a database function, migration 0003) grants under a
per-key lock, counting the units of the last period, those stamped later than its own clock
included. A job's key is formatted at enqueue like a ``Concurrency`` key and stored on the row
(``rate_key``); its limit, period and cost are its job's, read by the worker that claims it,
which spends the budget in the claim: a job over budget is not claimed and spends no attempt.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import clock
from .engines import get_engine
from .exceptions import ConfigurationError, InvalidRateKey
from .key_templates import KeyTemplate
from .records import RateRequest
from .values import INT32

if TYPE_CHECKING:
    from .registry import JobDefinition

__all__ = ["RateLimit"]

# The longest period a rate limit may have: its units stay in x_rate_units that long.
MAX_PERIOD = timedelta(days=31)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` units per ``period``, per value of ``key``, across the fleet.

    ``key`` is a template like ``Concurrency``'s (``"partner:{tenant_id}"``). A job spends
    ``cost`` units when it starts (default 1); ``try_acquire`` / ``acquire`` spend from the same
    budget in ordinary code. Everyone sharing a key must give it the same limit and period.
    """

    key: str
    limit: int
    period: timedelta
    cost: int = 1
    _template: KeyTemplate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        template = KeyTemplate(self.key, what="rate-limit key", owner="RateLimit",
                               error=InvalidRateKey)
        _check_units(self.limit, "limit")
        _check_units(self.cost, "cost")
        if self.cost > self.limit:
            raise ConfigurationError(
                f"RateLimit(cost={self.cost}) is more than its limit ({self.limit}): such a job "
                "could never start")
        if not isinstance(self.period, timedelta) or not (
                timedelta(milliseconds=1) <= self.period <= MAX_PERIOD):
            raise ConfigurationError(
                f"RateLimit(period=...) must be a timedelta from 1 ms to {MAX_PERIOD.days} days,"
                f" got {self.period!r:.80}")
        object.__setattr__(self, "_template", template)

    @property
    def period_ms(self) -> int:
        return max(1, round(self.period.total_seconds() * 1000))

    @property
    def fields(self) -> tuple[str, ...]:
        return self._template.fields

    def format(self, values: Mapping[str, Any], *, tenant_id: str | None = None,
               job: str = "job") -> str:
        """The key for one input; :class:`~django_xjobs.exceptions.InvalidRateKey` naming the
        field otherwise."""
        return self._template.format(values, tenant_id=tenant_id, job=job)

    # ------------------------------------------------------------------ ordinary code --
    def try_acquire(self, cost: int | None = None, **values: Any) -> bool:
        """Spend ``cost`` units (default: this limit's cost) now if the budget allows; whether
        it did. ``values`` fill the key template's fields (``tenant_id=`` included).

        Runs in a transaction of its own when called outside one; inside a caller's
        transaction the key stays locked until it ends, so keep such transactions short, and
        READ COMMITTED: a stricter caller is refused (IsolationLevelRefused), since its
        snapshot would not see the units spent after it (docs/guarantees.md, "Isolation
        levels").
        """
        return self._take(cost, values) is None

    def acquire(self, cost: int | None = None, *, timeout: float | timedelta | None = None,
                **values: Any) -> bool:
        """Wait until ``cost`` units can be spent, and spend them; False if ``timeout``
        (seconds or a timedelta; None waits as long as it takes) passes first."""
        limit = None if timeout is None else (
            timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout))
        deadline = None if limit is None else clock.monotonic() + limit
        while True:
            next_at = self._take(cost, values)
            if next_at is None:
                return True
            # next_at is a time on the database's clock: measure the wait on it too (a wall
            # clock behind would sleep that much longer, one ahead would spin).
            wait = max(0.001, (next_at - get_engine().db_now()).total_seconds())
            if deadline is not None:
                left = deadline - clock.monotonic()
                if left <= 0:
                    return False
                wait = min(wait, left)
            time.sleep(wait)

    def _take(self, cost: int | None, values: Mapping[str, Any]) -> datetime | None:
        units = self.cost if cost is None else cost
        _check_units(units, "cost", error=ValueError)
        if units > self.limit:
            raise ValueError(f"cost {units} is more than the limit {self.limit}: it could never "
                             "be spent")
        tenant = values.get("tenant_id")
        key = self.format(values, tenant_id=tenant if isinstance(tenant, str) else None,
                          job="RateLimit")
        return get_engine().rate_take([RateRequest(key, self.limit, self.period_ms, units)])[0]


def _check_units(value: Any, what: str, error: type[Exception] = ConfigurationError) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32:
        raise error(f"RateLimit {what} must be an integer from 1 to {INT32}, got {value!r:.40}")


def rate_limit_of(definition: JobDefinition | None) -> RateLimit | None:
    if definition is None:
        return None
    value = definition.options.get("rate_limit")
    return value if isinstance(value, RateLimit) else None


def check_option(definition: JobDefinition) -> None:
    """Validate ``@job(rate_limit=...)`` against the function it decorates."""
    value = definition.options.get("rate_limit")
    if value is None:
        definition.options.pop("rate_limit", None)
        return
    if not isinstance(value, RateLimit):
        raise ConfigurationError(
            f"{definition.name}: rate_limit= takes a RateLimit(key=..., limit=..., period=...), "
            f"got {value!r:.80}")
    value._template.check_parameters(definition.func, definition.name)
