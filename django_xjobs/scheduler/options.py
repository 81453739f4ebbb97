"""``@job(cron=..., timezone=..., misfire=..., overlap=...)``: the options the scheduler adds
to ``@job``.

The package's ``__init__`` registers :data:`CHECKS` (``registry.register_option``): the options
are known wherever ``@job`` is importable, also in a module imported before the app registry is
ready (a settings module, an app's ``__init__``;
tests/unit/test_registry.py::test_every_option_is_known_before_django_setup). They are
validated when the job is decorated: a bad expression or an unknown timezone fails at import
time, in the module that declared it.

Only ``registry`` and ``exceptions`` are imported here; ``cron`` (and croniter with it) is
imported when a job actually gives ``cron=``, so ``import django_xjobs`` stays light.
"""

from __future__ import annotations

from typing import Any

from .. import conf, registry
from ..exceptions import ConfigurationError

OPTIONS = ("cron", "timezone", "misfire", "overlap")


def validate(definition: registry.JobDefinition[..., Any]) -> None:
    """Check a definition's cron options and store them normalised."""
    options = definition.options
    expression = options.get("cron")
    if expression is None:
        given = [name for name in OPTIONS[1:] if name in options]
        if given:
            raise ConfigurationError(
                f"{definition.name}: {', '.join(f'{n}=' for n in given)} needs cron="
            )
        return
    from . import cron  # croniter costs tens of milliseconds: only for a job that gives cron=

    schedule = cron.parse(expression, options.get("timezone", "UTC"),
                          what=f"{definition.name}: cron")
    # The scheduler enqueues a cron job with no input: a required argument would fail every
    # occurrence with a TypeError.
    if definition.shape.required:
        raise ConfigurationError(
            f"{definition.name}: cron= runs {definition.shape.call} with no input, but it "
            f"requires {', '.join(sorted(definition.shape.required))}; give those parameters "
            'defaults, or schedule the job through XJOBS["SCHEDULE"] with an "input"'
        )
    options["cron"] = schedule.expression
    options["timezone"] = schedule.timezone
    options["misfire"] = cron.parse_misfire(options.get("misfire", "latest"),
                                            what=f"{definition.name}: misfire")
    options["overlap"] = conf.parse_overlap(options.get("overlap", "allow"),
                                            what=f"{definition.name}: overlap")


def _validated_with_cron(definition: registry.JobDefinition[..., Any]) -> None:
    """timezone=, misfire= and overlap= are judged together with cron= by :func:`validate`."""


# Each option and its check, for ``registry.register_option``.
CHECKS: dict[str, registry.OptionCheck] = {
    "cron": validate, "timezone": _validated_with_cron, "misfire": _validated_with_cron,
    "overlap": _validated_with_cron,
}
