"""``@job(cron=..., timezone=..., misfire=..., overlap=...)`` and ``@job(every=...)``: the
options the scheduler adds to ``@job``.

The package's ``__init__`` registers :data:`CHECKS` (``registry.register_option``): the options
are known wherever ``@job`` is importable, also in a module imported before the app registry is
ready (a settings module, an app's ``__init__``;
tests/unit/test_registry.py::test_every_option_is_known_before_django_setup). They are
validated when the job is decorated: a bad expression, an unknown timezone or an interval out
of range fails at import time, in the module that declared it.

Only ``registry``, ``conf`` and ``exceptions`` are imported here; ``cron`` (and croniter with
it) is imported when a job actually gives ``cron=``, ``interval`` when it gives ``every=``, so
``import django_xjobs`` stays light.
"""

from __future__ import annotations

from typing import Any

from .. import conf, registry
from ..exceptions import ConfigurationError

OPTIONS = ("cron", "every", "timezone", "misfire", "overlap")
_WITH_A_SCHEDULE = ("timezone", "misfire", "overlap")


def validate(definition: registry.JobDefinition[..., Any]) -> None:
    """Check a definition's schedule options and store them normalised: ``cron`` (with
    ``timezone``) or ``every``, never both; ``misfire`` and ``overlap`` with either."""
    options = definition.options
    expression, every = options.get("cron"), options.get("every")
    if expression is not None and every is not None:
        raise ConfigurationError(
            f"{definition.name}: cron= and every= are two ways to give a schedule; give one"
        )
    if expression is None and every is None:
        given = [name for name in _WITH_A_SCHEDULE if name in options]
        if given:
            needs = "cron=" if given == ["timezone"] else "cron= or every="
            raise ConfigurationError(
                f"{definition.name}: {', '.join(f'{n}=' for n in given)} needs {needs}"
            )
        return
    if every is not None and "timezone" in options:
        raise ConfigurationError(
            f"{definition.name}: timezone= goes with cron= only: an interval (every=) counts "
            "real seconds on a grid anchored at the Unix epoch, which no timezone or "
            "daylight-saving change moves (docs/scheduling.md, \"Intervals\")"
        )
    # Imported here, not with the package: cron.py is what parses (and croniter, on the first
    # parse, costs tens of milliseconds); an interval needs only the standard library.
    from . import cron, interval

    if expression is not None:
        schedule = cron.parse(expression, options.get("timezone", "UTC"),
                              what=f"{definition.name}: cron")
        normalised: dict[str, Any] = {"cron": schedule.expression, "timezone": schedule.timezone}
    else:
        normalised = {"every": interval.parse(every, what=f"{definition.name}: every").every}
    # The scheduler enqueues a scheduled job with no input: a required argument would fail
    # every occurrence with a TypeError.
    if definition.shape.required:
        raise ConfigurationError(
            f"{definition.name}: {next(iter(normalised))}= runs {definition.shape.call} with no "
            f"input, but it requires {', '.join(sorted(definition.shape.required))}; give those "
            'parameters defaults, or schedule the job through XJOBS["SCHEDULE"] with an "input"'
        )
    options.update(normalised)
    options["misfire"] = cron.parse_misfire(options.get("misfire", "latest"),
                                            what=f"{definition.name}: misfire")
    options["overlap"] = conf.parse_overlap(options.get("overlap", "allow"),
                                            what=f"{definition.name}: overlap")


def _validated_with_the_schedule(definition: registry.JobDefinition[..., Any]) -> None:
    """every=, timezone=, misfire= and overlap= are judged together with cron= by
    :func:`validate`, which runs once per definition (as the check of ``cron``)."""


# Each option and its check, for ``registry.register_option``.
CHECKS: dict[str, registry.OptionCheck] = {
    "cron": validate, "every": _validated_with_the_schedule,
    "timezone": _validated_with_the_schedule, "misfire": _validated_with_the_schedule,
    "overlap": _validated_with_the_schedule,
}
