"""An enqueuing process of the upgrade test: ``python -m tests.upgrade.producer --by old --log F``
under the settings of tests/upgrade/settings.py, with either version first on PYTHONPATH.

It enqueues a steady mix through the API both versions have (``django_xjobs.enqueue`` by name)
until SIGTERM, and writes one JSON line per enqueue to ``--log``: what it enqueued, the job id
it got back and whether that call created it, how long the call took, and the error if it
raised (the producer carries on after an error, as a web server would).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import traceback

KINDS = ("plain", "limited", "durable")


def kind_of(i: int, durable_every: int) -> str:
    """Every ``durable_every``-th enqueue a durable run, then alternately a keyed enqueue of the
    concurrency-limited job and a plain job."""
    if i % durable_every == 0:
        return "durable"
    return "limited" if i % 2 else "plain"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--by", required=True, help="the version this producer runs: old or new")
    p.add_argument("--log", required=True)
    p.add_argument("--rate", type=float, default=50.0, help="enqueues per second")
    p.add_argument("--durable-every", type=int, default=10)
    p.add_argument("--keys", type=int, default=20,
                   help="idempotency keys of the limited job's enqueues, shared by both versions")
    p.add_argument("--groups", type=int, default=2, help="concurrency groups of the limited job")
    args = p.parse_args()

    import django

    django.setup()
    from django_xjobs import enqueue

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    names = {k: f"upgradeapp.{k}" for k in KINDS}
    interval = 1.0 / args.rate
    due = time.monotonic()
    i = 0
    with open(args.log, "a", buffering=1) as log:
        log.write(json.dumps({"started": os.getpid()}) + "\n")
        while not stop.is_set():
            kind = kind_of(i, args.durable_every)
            input: dict = {"by": args.by, "n": i}
            options: dict = {}
            if kind == "limited":
                input["group"] = f"g{i % args.groups}"
                options["idempotency_key"] = f"k{i % args.keys}"
            line: dict = {"i": i, "kind": kind, "at": time.time()}
            began = time.perf_counter()
            try:
                handle = enqueue(names[kind], input, **options)
            except Exception as exc:
                line["error"] = f"{type(exc).__name__}: {exc}"
                line["traceback"] = traceback.format_exc()
            else:
                line["id"] = str(handle.id)
                line["created"] = handle.created
            line["ms"] = round((time.perf_counter() - began) * 1000, 3)
            log.write(json.dumps(line) + "\n")
            i += 1
            # The pacing is the workload (a steady rate of enqueues), not a wait for anything.
            due += interval
            stop.wait(max(0.0, due - time.monotonic()))
        log.write(json.dumps({"stopped": os.getpid(), "enqueues": i}) + "\n")


if __name__ == "__main__":
    main()
