"""Helpers for testing code that enqueues jobs, and jobs themselves (docs/testing.md)::

    from django_xjobs.testing import (
        drain,            # run what is due until nothing is (worker threads, or inline)
        travel,           # make waiting jobs due as if time had passed
        enqueued_jobs,    # the jobs in the table, filtered
        assert_enqueued,  # a job with this name and (at least) this input exists
        make_context,     # a JobContext for calling a job function in a plain unit test
    )

and ``XJOBS["TEST_MODE"] = "inline"``, which runs each job when the transaction that enqueued it
commits (``testing/inline.py``).

Names are imported on first use: the app's ``ready()`` imports ``testing.inline`` in every
process, and that must not cost a web process the worker loop's imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "MemorySteps",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "make_context",
    "travel",
]

if TYPE_CHECKING:
    from .context import MemorySteps, make_context
    from .draining import drain
    from .rows import assert_enqueued, enqueued_jobs, travel


def __getattr__(name: str) -> Any:
    # Each import names its module (the import contract sees it) and waits for the first use
    # of a name: the docstring says why.
    if name == "drain":
        from .draining import drain  # on first use

        return drain
    if name in ("travel", "enqueued_jobs", "assert_enqueued"):
        from . import rows  # on first use

        return getattr(rows, name)
    if name in ("make_context", "MemorySteps"):
        from . import context  # on first use

        return getattr(context, name)
    raise AttributeError(f"module 'django_xjobs.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
