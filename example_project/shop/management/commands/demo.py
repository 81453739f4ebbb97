"""``manage.py demo`` (what `make demo` runs): migrate, enqueue real work, run a real worker,
and show what happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection, transaction

from shop import demo_backfills, demo_outbox, demo_scheduler, demo_slots
from shop.demo_console import show_console
from tests import devdb

PROJECT_DIR = Path(__file__).resolve().parents[3]


class Command(BaseCommand):
    help = "Run the django-xjobs demo: orders charged and shipped by a real worker."

    def add_arguments(self, parser):
        parser.add_argument("--orders", type=int, default=12)
        parser.add_argument("--timeout", type=float, default=90.0)

    def say(self, text=""):
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **options):
        self.say(self.style.MIGRATE_HEADING("django-xjobs demo"))
        self.say(f"database: {settings.DATABASE_SOURCE}, database name "
                 f"{settings.DATABASES['default']['NAME']!r}")
        if devdb.ensure_database(settings.DATABASES["default"]):
            self.say("created the database")
        call_command("migrate", verbosity=0)
        self.say("migrated (django_xjobs tables: x_jobs, x_job_steps, x_job_events, x_outbox, "
                 "x_job_leases, x_scheduler_leader, x_scheduler_state, x_backfills)")

        from django_xjobs.models import Job
        from shop.jobs import DISCONTINUED, charge_order, send_digest
        from shop.models import Order

        batch = time.strftime("demo-%Y%m%d-%H%M%S")
        n = max(3, options["orders"])
        charge_handles = []
        # Business write and enqueue in one transaction: the jobs exist only if the orders do.
        with transaction.atomic():
            for i in range(n):
                sku = sorted(DISCONTINUED)[0] if i == n - 1 else f"SKU-{100 + i}"
                order = Order.objects.create(batch=batch, email=f"customer{i}@example.com",
                                             sku=sku, total_cents=1000 + 250 * i)
                charge_handles.append(
                    charge_order.using(idempotency_key=f"charge:{order.pk}").enqueue(
                        order_id=order.pk)
                )
            # Enqueue one of them again: same key, same live job, nothing new.
            again = charge_order.using(idempotency_key=f"charge:{order.pk}").enqueue(
                order_id=order.pk)
        self.say(f"\ncreated {n} orders in batch {batch} and enqueued {n} charge_order jobs "
                 f"(queue 'payments'); enqueuing the last one again returned the same job "
                 f"(created={again.created}, id matches: {again.id == charge_handles[-1].id})")

        worker = self._start_worker()
        try:
            order_ids = list(Order.objects.filter(batch=batch).values_list("pk", flat=True))
            ship_keys = [f"ship:{pk}" for pk in order_ids]
            self._wait(lambda: self._all_finished(Job, charge_handles, ship_keys, n),
                       options["timeout"], "charge and ship jobs")
            digest = send_digest.enqueue(batch=batch)
            self._wait(lambda: Job.objects.get(pk=digest.id).state in ("done", "dead"),
                       options["timeout"], "the digest job")
            workflows = self._durable_workflow(Job, Order, batch, options["timeout"])
            demo_backfills.show(self.stdout, self.style, options["timeout"])
            demo_outbox.run(self.stdout, batch, options["timeout"])
            demo_slots.run(self.stdout, options["timeout"])
            demo_scheduler.show(self.stdout, options["timeout"])
        finally:
            self.say("\nstopping the worker with SIGTERM (graceful: in-flight jobs finish)")
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
            time.sleep(0.1)  # let the log pump print the last lines
        self._summary(Job, Order, batch, charge_handles, ship_keys, digest)
        self._workflow_summary(Job, Order, workflows)
        show_console(self.stdout)  # ---- console ----

    # ----------------------------------------------------------------------------------
    def _durable_workflow(self, Job, Order, batch, timeout):
        """Two fulfil_order workflows: they suspend waiting for a payment event, resume when
        the demo publishes it, sleep until the next pickup, and ship."""
        from django_xjobs import publish_event
        from shop.jobs import fulfil_order

        orders = [Order.objects.create(batch=batch, email=f"vip{i}@example.com",
                                       sku=f"SKU-90{i}", total_cents=5000 + 100 * i)
                  for i in range(2)]
        handles = [fulfil_order.enqueue(order_id=o.pk) for o in orders]
        self.say(self.style.MIGRATE_HEADING("\na durable workflow (shop.fulfil_order)"))
        self._wait(lambda: all(Job.objects.get(pk=h.id).state == "suspended" for h in handles),
                   timeout, "the workflows to suspend")
        for h, o in zip(handles, orders, strict=True):
            job = Job.objects.get(pk=h.id)
            self.say(f"  order {o.pk}: job {job.id} is {job.state}, waiting for event "
                     f"'payment.captured' (key {o.pk}); no worker thread is held")
        for o in orders:
            publish_event("payment.captured", {"amount": o.total_cents},
                          correlation_key=str(o.pk))
            self.say(f"  published payment.captured for order {o.pk}")
        self._wait(lambda: all(Job.objects.get(pk=h.id).state in ("done", "dead")
                               for h in handles), timeout, "the workflows to finish")
        return list(zip(handles, orders, strict=True))

    def _workflow_summary(self, Job, Order, workflows):
        self.say(self.style.MIGRATE_HEADING("\nthe workflows, resumed and finished"))
        for h, o in workflows:
            job = Job.objects.get(pk=h.id)
            order = Order.objects.get(pk=o.pk)
            self.say(f"  order {o.pk}: {job.state} at attempt {job.attempt} "
                     f"(waking from a wait or a sleep spends none): {order.timeline}")
        self.say(f"  its steps: python manage.py xjobs show {workflows[0][0].id}")

    def _start_worker(self):
        self.say("\nstarting a worker: manage.py xjobs_worker --concurrency 4\n")
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "xjobs_worker", "--concurrency", "4"],
            cwd=PROJECT_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )

        def pump():
            for line in proc.stdout:
                self.say(f"  worker | {line.rstrip()}")

        threading.Thread(target=pump, daemon=True).start()
        return proc

    def _wait(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: timed out after {timeout}s waiting for {what}")
            time.sleep(0.1)
            connection.close()  # fresh snapshot each poll, as a separate session would see

    @staticmethod
    def _all_finished(Job, charge_handles, ship_keys, n):
        finished = ("done", "dead", "cancelled")
        charges = Job.objects.filter(pk__in=[h.id for h in charge_handles])
        if charges.exclude(state__in=finished).exists():
            return False
        ships = Job.objects.filter(name="shop.ship_order", idempotency_key__in=ship_keys)
        return ships.count() == n and not ships.exclude(state__in=finished).exists()

    def _summary(self, Job, Order, batch, charge_handles, ship_keys, digest):
        self.say(self.style.MIGRATE_HEADING("\nqueue stats (manage.py xjobs)"))
        call_command("xjobs", stdout=self.stdout)

        self.say(self.style.MIGRATE_HEADING("\norders of this batch"))
        for status in ("shipped", "rejected", "charged", "new"):
            count = Order.objects.filter(batch=batch, status=status).count()
            if count:
                self.say(f"  {status:<9} {count}")

        retried = Job.objects.filter(pk__in=[h.id for h in charge_handles], state="done",
                                     attempt__gt=1).order_by("id")
        shown = min(3, retried.count())
        self.say(self.style.MIGRATE_HEADING(
            f"\nfailed, then retried and done ({retried.count()} charge_order jobs"
            + (f", the first {shown} shown)" if shown < retried.count() else ")")))
        for job in retried[:3]:
            first_error = (job.last_error or "").strip().splitlines()[-1]
            self.say(f"  {job.id}  attempts {job.attempt}/{job.max_attempts}  "
                     f"first error: {first_error}")
            self.say(f"      result: {job.result}")

        dead = Job.objects.filter(name="shop.ship_order", idempotency_key__in=ship_keys,
                                  state="dead")
        self.say(self.style.MIGRATE_HEADING(f"\ndead ({dead.count()} job)"))
        for job in dead:
            self.say(f"  {job.id}  {job.name} attempt {job.attempt}/{job.max_attempts}: "
                     f"{(job.last_error or '').strip().splitlines()[-1]}")
            self.say(f"      see: python manage.py xjobs show {job.id}")

        d = Job.objects.get(pk=digest.id)
        self.say(self.style.MIGRATE_HEADING("\nasync digest job, fanned out to child jobs"))
        self.say(f"  {d.id}  {d.state}: {d.result}")
        self.say(f"      its children: python manage.py xjobs show {d.id}")

