"""django-xjobs at another git revision, beside this checkout in one run of the peers' harness:
`make bench-peers PEERS_HARNESS=<folder> BASELINE=<rev>` (docs/performance.md, "Beside the
peers").

The Makefile exports the revision's django_xjobs, tests and bench/xbench_project into a
directory (git archive), byte-compiles it as it does this checkout, and names it in
XBENCH_XJOBS_BASELINE (the revision in XBENCH_XJOBS_BASELINE_REV). Its workers and its client
import the package and the project from there, ahead of the editable install of this checkout;
everything else is bench/xjobs_adapter.py's, under another name and database.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# The harness loads each adapter file by path: load this one's sibling the same way.
_spec = importlib.util.spec_from_file_location(
    "xjobs_adapter_for_baseline", Path(__file__).resolve().parent / "xjobs_adapter.py")
assert _spec is not None and _spec.loader is not None
_this = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_this)

BASELINE = Path(os.environ.get("XBENCH_XJOBS_BASELINE", "/nonexistent"))
REV = os.environ.get("XBENCH_XJOBS_BASELINE_REV", "baseline")


class BaselineAdapter(_this.XJobsAdapter):
    name = "django-xjobs-baseline"
    label = f"django-xjobs ({REV})"
    dbname = "xb_django_xjobs_baseline"
    project_dir = BASELINE / "bench"
    source_dir = BASELINE

    def unavailable_reason(self):
        if not (BASELINE / "django_xjobs").is_dir():
            return ("no baseline checkout: XBENCH_XJOBS_BASELINE must name a directory holding "
                    "django_xjobs (make bench-peers BASELINE=<rev> exports one)")
        return None


ADAPTER = BaselineAdapter
