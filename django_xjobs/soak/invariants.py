"""The soak's invariants, checked over the tables once everything it enqueued has finished
(docs/soak.md, "The invariants"). Each check returns a :class:`Verdict`: what held, in numbers,
or what did not, with the offending job ids.

The evidence: the ledger (what the producers committed, rolled back, staged and cancelled), the
effects (what each run of a body did, with the database's clock), the jobs' rows, their steps,
the outbox, the counters, and the :class:`~.observe.Observations` sampled during the run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Sum

from ..models import Job, JobStep, OutboxEntry, Stat, StatDelta
from ..records import TERMINAL_STATES
from . import jobs, tables
from .observe import Observations, grants_over_limit

SHOWN_IDS = 10  # offending ids printed per invariant


@dataclass
class Verdict:
    name: str
    held: bool
    detail: str
    offenders: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Its line; failed, the offenders: ids on one line, sentences (a session's finding,
        a worker that did not stop) one a line."""
        head = f"  {'ok  ' if self.held else 'FAIL'}  {self.name:<34} {self.detail}"
        if self.held or not self.offenders:
            return [head]
        shown = self.offenders[:SHOWN_IDS]
        more = len(self.offenders) - SHOWN_IDS
        first = "        offending: "
        if all(len(o.split()) == 1 for o in shown):
            return [head, first + ", ".join(shown) + (f" and {more} more" if more > 0 else "")]
        indent = " " * len(first)
        return [head, first + shown[0], *(indent + o for o in shown[1:]),
                *([f"{indent}and {more} more"] if more > 0 else [])]


def verdict(name: str, offenders: Iterable[Any], ok: str, bad: str) -> Verdict:
    found = sorted({str(o) for o in offenders})
    return Verdict(name, not found, bad.format(n=len(found)) if found else ok, found)


def terminal_transitions(queue: str) -> int:
    """Every transition into done, dead or cancelled the counters hold for ``queue``: the
    deltas not yet folded plus the totals, read in one snapshot (the rollup moves deltas into
    the totals in one transaction)."""
    alias = tables.alias()
    fields = ("done", "dead", "cancelled")
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cur:
            cur.execute("set transaction isolation level repeatable read")
        totals = Stat.objects.using(alias).filter(queue=queue, grain="total").aggregate(
            **{f: Sum(f) for f in fields})
        deltas = StatDelta.objects.using(alias).filter(queue=queue).aggregate(
            **{f: Sum(f) for f in fields})
    return sum((totals[f] or 0) + (deltas[f] or 0) for f in fields)


@dataclass
class Evidence:
    soak: str
    queue: str
    ledger: list[tuple[Any, ...]]  # (job_id, kind, outcome, changed, attempt, at)
    effects: list[tuple[Any, ...]]  # (job_id, attempt, kind, tag, pid, at)
    rows: dict[str, Job]
    steps: dict[str, list[JobStep]]  # run id -> steps
    outbox: dict[str, OutboxEntry]
    transitions: int  # terminal transitions in the counters during the soak
    seen: Observations

    @classmethod
    def gather(cls, soak: str, queue: str, transitions_before: int,
               seen: Observations) -> Evidence:
        alias = tables.alias()
        ledger = tables.ledger_rows(soak)
        rows = {str(j.id): j for j in Job.objects.using(alias).filter(queue=queue,
                                                                        input__soak=soak)}
        run_ids = [j.run_id for j in rows.values()]
        steps: dict[str, list[JobStep]] = defaultdict(list)
        for step in JobStep.objects.using(alias).filter(run_id__in=run_ids):
            steps[str(step.run_id)].append(step)
        staged = [r[0] for r in ledger if r[1] == "on_commit"]
        outbox = {str(o.id): o for o in OutboxEntry.objects.using(alias).filter(id__in=staged)}
        return cls(soak, queue, ledger, tables.effect_rows(soak), rows, steps, outbox,
                   terminal_transitions(queue) - transitions_before, seen)

    def of_kind(self, *kinds: str, outcome: str = "committed") -> list[str]:
        return [str(r[0]) for r in self.ledger if r[1] in kinds and r[2] == outcome]

    def effects_of(self, job_id: str) -> list[tuple[Any, ...]]:
        return self._by_job.get(job_id, [])

    def __post_init__(self) -> None:
        self._by_job: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        for e in self.effects:
            self._by_job[str(e[0])].append(e)


# --------------------------------------------------------------------------------- checks --

def nothing_lost(ev: Evidence) -> Verdict:
    calls = ev.of_kind(*KINDS_ENQUEUED)
    committed = set(calls)
    staged = set(ev.of_kind("on_commit", outcome="staged"))
    missing = [i for i in committed | staged if i not in ev.rows]
    rolled_back = set(ev.of_kind("rollback", "on_commit", outcome="rolled_back"))
    resurrected = [i for i in rolled_back if i in ev.rows or i in ev.outbox]
    v = verdict("nothing lost", missing + resurrected,
                f"{len(calls) + len(staged)} committed enqueues, {len(committed | staged)} "
                f"jobs, all there; {len(rolled_back)} rolled back, none there",
                "{n} enqueues lost, or rolled back and still there")
    return v


KINDS_ENQUEUED = ("plain", "slow", "steps", "slot", "rate", "poison", "duplicate", "cancel")


def everything_finished(ev: Evidence) -> Verdict:
    live = [i for i, j in ev.rows.items() if j.state not in TERMINAL_STATES]
    states: dict[str, int] = defaultdict(int)
    for j in ev.rows.values():
        states[j.state] += 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    return verdict("everything finished", live, f"{len(ev.rows)} jobs: {summary}",
                   "{n} jobs not finished after the drain")


def one_terminal_transition(ev: Evidence) -> Verdict:
    """The counters are written in the statements that change state: as many transitions into
    a final state as finished jobs means none finished twice. And a done job's result is the
    nonce of an ``end`` written by a run of its last attempt: the settlement is that run's."""
    finished = sum(1 for j in ev.rows.values() if j.state in TERMINAL_STATES)
    offenders = []
    for job_id, j in ev.rows.items():
        if j.state != "done":
            continue
        nonce = (j.result or {}).get("nonce")
        ends = {(e[1], e[3]) for e in ev.effects_of(job_id) if e[2] == "end"}
        if (j.attempt, nonce) not in ends:
            offenders.append(job_id)
    if ev.transitions != finished:
        offenders.append(f"counters: {ev.transitions} final transitions for {finished} "
                         f"finished jobs")
    return verdict("one final transition per job", offenders,
                   f"{ev.transitions} final transitions for {finished} finished jobs; every "
                   f"done job settled by its last run",
                   "{n} jobs settled twice or by a stale run")


def attempts_within_bounds(ev: Evidence) -> Verdict:
    poison = set(ev.of_kind("poison"))
    offenders = []
    for job_id, j in ev.rows.items():
        ran = max((e[1] for e in ev.effects_of(job_id)), default=0)
        over = j.attempt > j.max_attempts or ran > j.attempt
        if job_id in poison:  # dead, at exactly its last attempt
            wrong = j.state != "dead" or j.attempt != j.max_attempts
        else:  # every other job can finish: none may be dead
            wrong = j.state == "dead"
        if over or wrong:
            offenders.append(job_id)
    most = max((j.attempt for j in ev.rows.values()), default=0)
    return verdict("attempts within bounds", offenders,
                   f"{len(poison)} poison jobs dead at exactly {jobs.POISON_ATTEMPTS} attempts; "
                   f"no other job dead; most attempts {most}",
                   "{n} jobs over their attempts, or dead/alive against their kind")


def steps_never_rerun(ev: Evidence) -> Verdict:
    """No step body starts after its step's memo was written; the step after the durable
    sleep starts no earlier than the sleep's wake time (all on the database clock)."""
    offenders = []
    checked = 0
    for job_id in ev.of_kind("steps"):
        j = ev.rows.get(job_id)
        if j is None:
            continue
        memo = {s.name: s for s in ev.steps.get(str(j.run_id), [])}
        for e in ev.effects_of(job_id):
            if e[2] != "step":
                continue
            step = memo.get(e[3])
            if step is not None and step.completed_at is not None and e[5] > step.completed_at:
                offenders.append(job_id)
            nap = memo.get("nap")
            if e[3] == "second" and (nap is None or nap.wake_at is None or e[5] < nap.wake_at):
                offenders.append(job_id)
        checked += j.state == "done"
    return verdict("completed steps never re-run", offenders,
                   f"{checked} durable runs done; no step body after its memo, none before "
                   f"its wake time", "{n} runs re-ran a completed step or woke early")


def _intervals(ev: Evidence, kinds: Sequence[str]) -> dict[str, list[tuple[datetime, datetime]]]:
    """Per concurrency key: the [start, end] of each run whose result settled its job."""
    out: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for job_id in ev.of_kind(*kinds):
        j = ev.rows.get(job_id)
        if j is None or j.state != "done" or not j.concurrency_key:
            continue
        mine = [e for e in ev.effects_of(job_id) if e[1] == j.attempt]
        start = next((e[5] for e in mine if e[2] == "start"), None)
        end = next((e[5] for e in mine if e[2] == "end"), None)
        if start and end:
            out[j.concurrency_key].append((start, end))
    return out


def slots_respected(ev: Evidence) -> Verdict:
    offenders = list(ev.seen.slot_excess)
    runs = 0
    for key, spans in _intervals(ev, ["slot"]).items():
        runs += len(spans)
        points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                        key=lambda p: (p[0], p[1]))
        now = 0
        for at, step in points:
            now += step
            if now > jobs.SLOT_LIMIT:
                offenders.append(f"{key}: {now} settled runs at once at {at.isoformat()}")
                break
    return verdict("slots never exceeded", offenders,
                   f"{runs} slot runs on 3 keys, never more than {jobs.SLOT_LIMIT} at once "
                   f"({ev.seen.samples} samples)", "{n} times over the limit")


def rate_respected(ev: Evidence) -> Verdict:
    over = grants_over_limit(ev.seen.grants, jobs.RATE_LIMIT,
                             jobs.RATE_PERIOD.total_seconds())
    return verdict("rate limit never exceeded", over,
                   f"{len(ev.seen.grants)} grants seen, never more than {jobs.RATE_LIMIT} "
                   f"in {jobs.RATE_PERIOD.total_seconds():g}s",
                   "{n} windows over the budget")


def one_live_job_per_key(ev: Evidence) -> Verdict:
    offenders = [f"{key}: {sorted(ids)}" for key, ids in ev.seen.live_key_duplicates.items()]
    duplicates = ev.of_kind("duplicate")
    keys = {ev.rows[i].idempotency_key for i in duplicates if i in ev.rows}
    return verdict("one live job per key", offenders,
                   f"{len(duplicates)} duplicate enqueues onto {len(keys)} jobs; "
                   f"never two live jobs of a key in {ev.seen.samples} samples",
                   "{n} keys with two live jobs at once")


def outbox_exactly_once(ev: Evidence) -> Verdict:
    staged = ev.of_kind("on_commit", outcome="staged")
    offenders = []
    for staging_id in staged:
        entry = ev.outbox.get(staging_id)
        if entry is None or entry.published_at is None or str(entry.job_id) != staging_id:
            offenders.append(staging_id)
    rolled_back = ev.of_kind("on_commit", outcome="rolled_back")
    offenders += [i for i in rolled_back if i in ev.outbox]
    return verdict("outbox published exactly once", offenders,
                   f"{len(staged)} staged, each published once as its own job; "
                   f"{len(rolled_back)} rolled back, none published",
                   "{n} stagings unpublished, published twice, or published after a rollback")


def cancels_stick(ev: Evidence) -> Verdict:
    """A cancelled job stays cancelled, and no claim after the cancel starts it again: no run
    with an attempt above the job's attempt when the cancel committed. (A run claimed before
    the cancel may write its ``start`` a moment after it: the body starts after the claim.)"""
    offenders = []
    cancelled = 0
    for job_id, _, outcome, changed, attempt, _ in ev.ledger:
        if outcome != "cancel_requested":
            continue
        job_id = str(job_id)
        j = ev.rows.get(job_id)
        if j is None:
            offenders.append(job_id)
            continue
        if changed:
            cancelled += 1
            again = [e for e in ev.effects_of(job_id) if e[2] == "start" and e[1] > attempt]
            if j.state != "cancelled" or again:
                offenders.append(job_id)
    return verdict("cancels stick", offenders,
                   f"{cancelled} cancelled: each stayed cancelled, none claimed again",
                   "{n} cancelled jobs ran again or finished otherwise")


def hygiene(ev: Evidence, stop_complaints: Sequence[str]) -> Verdict:
    offenders = (ev.seen.long_transactions() + ev.seen.advisory_outside
                 + list(stop_complaints))
    return verdict("sessions and processes clean", offenders,
                   "no worker transaction open past a lease, no advisory lock "
                   "outside a transaction, every worker stopped cleanly",
                   "{n} findings")


def check_all(ev: Evidence, stop_complaints: Sequence[str]) -> list[Verdict]:
    return [
        nothing_lost(ev),
        everything_finished(ev),
        one_terminal_transition(ev),
        attempts_within_bounds(ev),
        steps_never_rerun(ev),
        slots_respected(ev),
        rate_respected(ev),
        one_live_job_per_key(ev),
        outbox_exactly_once(ev),
        cancels_stick(ev),
        hygiene(ev, stop_complaints),
    ]
