"""The upgrade test: a baseline of django-xjobs (tests/upgrade/baselines.py) migrated to this
working tree under load, both versions' fleets side by side, then the old one stopped.

    python -m tests.upgrade.run [--rows 1000000] [--overlap 200] [--baseline NAME] [--keep]

Phases, each printed as it starts:

1. ``fresh``: the database ``--database`` (default ``xjobs_upgrade``) dropped and created.
2. ``old-migrate``: ``migrate`` with the baseline's code (its ``django_xjobs`` package taken from
   git into a temporary directory, first on PYTHONPATH; same interpreter and Django).
3. ``fill``: ``--rows`` finished jobs in ``x_jobs``, set-based, at the baseline's schema.
4. ``old-fleet``: two old workers and an old producer (tests/upgrade/producer.py), until the old
   workers have run ``--overlap`` jobs and suspended durable runs.
5. ``new-migrate``: ``migrate -v 2`` with the working tree's code under that load; Django prints
   each migration's time.
6. ``mixed-fleet``: two new workers and a new producer beside the old ones, until each version's
   workers have run ``--overlap`` jobs the other version enqueued.
7. ``stop-old``: SIGTERM to the old producer and workers; each must exit by itself.
8. ``finish-upgrade``: ``xjobs fleet --finish-upgrade`` with the new code, the operator's step
   once no old process is left (docs/deployment.md).
9. ``new-only``: the new producer for ``--overlap`` more enqueues, then stopped.
10. ``resume``: once every durable run is suspended and every other job done, the event the
    durable runs wait for is published (new code); then until every job is done, and the new
    workers are stopped.
11. ``checks``: every job a producer was given is done (nothing lost), no job attempt and no
    step body ran twice (tests/upgrade/app/models.py), every durable run resumed, no failed
    enqueue, no WARNING, ERROR or Traceback in either version's logs (every job here succeeds
    at its first attempt, so a failed attempt's warning is a failure too).

The report gives each migration's time, each producer's longest enqueue stall (overall and while
``migrate`` ran), the counts, and each failure with its text. Exit status 0 when every check
passes, 1 when one fails, 2 when the run could not get that far. tests/acceptance/test_upgrade.py
runs it small; ``make upgrade-check`` at 1,000,000 rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from tests import devdb
from tests.upgrade.baselines import BASELINES, DEFAULT, Baseline

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "tests.upgrade.settings"
QUEUE = "upgrade"
RESUME_EVENT = "upgrade.resume"  # tests/upgrade/app/jobs.py waits for it
# Bounds on waits for what the processes do: they end a run that went wrong, they are not
# measurements. The machine is small and shared.
STARTUP = 60.0
SETTLE = 180.0
T = TypeVar("T")


class Failed(Exception):
    """The run could not go on: a phase did not reach its end (the message says why)."""


@dataclass
class Process:
    side: str  # "old" or "new"
    role: str  # "worker-1", "producer", ...
    popen: subprocess.Popen[bytes]
    log: Path
    events: Path | None = None  # a producer's JSON lines

    @property
    def name(self) -> str:
        return f"{self.side} {self.role}"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Report:
    baseline: str
    rows: int
    phases: list[tuple[str, float]] = field(default_factory=list)
    migrations: list[tuple[str, float]] = field(default_factory=list)
    expected_migrations: list[str] = field(default_factory=list)  # the tree's, not the baseline's
    stalls: dict[str, dict[str, Any]] = field(default_factory=dict)
    enqueues: dict[str, Counter[str]] = field(default_factory=dict)
    executions: dict[str, int] = field(default_factory=dict)
    cross: dict[str, int] = field(default_factory=dict)
    durable_suspended_old: int = 0
    durable_resumed_new: int = 0
    jobs: int = 0
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    # The checks: each a list of what failed, empty when it passed.
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    not_resumed: list[str] = field(default_factory=list)
    failed_enqueues: dict[str, Counter[str]] = field(default_factory=dict)
    log_errors: dict[str, list[str]] = field(default_factory=dict)
    failure: str | None = None  # a phase that did not finish (the checks are then partial)

    def problems(self) -> list[str]:
        found = []
        if self.failure:
            found.append(f"the run stopped (nothing lost or resumed is then known): "
                         f"{self.failure}")
        if not self.failure and [m for m, _ in self.migrations] != self.expected_migrations:
            found.append(f"migrate applied {[m for m, _ in self.migrations]}, expected "
                         f"{self.expected_migrations}")
        if self.lost:
            found.append(f"{len(self.lost)} job(s) not done (lost): {self.lost[:10]}")
        if self.twice:
            found.append(f"{len(self.twice)} run(s) twice: {self.twice[:10]}")
        if self.not_resumed:
            found.append(f"{len(self.not_resumed)} durable run(s) not resumed once under the "
                         f"new version: {self.not_resumed[:10]}")
        for producer, errors in self.failed_enqueues.items():
            for text, n in errors.most_common():
                found.append(f"{producer}: {n} failed enqueue(s): {text}")
        for name, lines in self.log_errors.items():
            found.append(f"{name} log: {len(lines)} warning or error line(s), first: "
                         + "; ".join(lines[:3]))
        return found

    def text(self) -> str:
        out = [f"upgrade from {self.baseline} at {self.rows:,} finished jobs"]
        out.append("phases: " + ", ".join(f"{p} {s:.1f} s" for p, s in self.phases))
        out.append("migrate (new code, under load), per migration:")
        out += [f"  {name:<40} {s:8.3f} s" for name, s in self.migrations]
        out.append(f"  {'total':<40} {sum(s for _, s in self.migrations):8.3f} s")
        out.append("longest enqueue stall per producer (all / while migrate ran / p99):")
        for producer, s in self.stalls.items():
            behind = f"   (during {s['behind']})" if s["behind"] else ""
            out.append(f"  {producer:<12} {s['max']:8.1f} ms {s['migrate']:8.1f} ms "
                       f"{s['p99']:8.1f} ms{behind}")
        for producer, counts in self.enqueues.items():
            out.append(f"enqueues by {producer}: " + ", ".join(
                f"{k} {v}" for k, v in sorted(counts.items())))
        out.append("executions by side: " + ", ".join(
            f"{k} {v}" for k, v in sorted(self.executions.items())))
        out.append("ran the other version's jobs: " + ", ".join(
            f"{k} {v}" for k, v in sorted(self.cross.items())))
        out.append(f"durable runs: {self.durable_suspended_old} suspended under the old version, "
                   f"{self.durable_resumed_new} resumed under the new one")
        out.append(f"jobs enqueued in the run: {self.jobs}")
        out.append("exit codes: " + ", ".join(f"{k} {v}" for k, v in self.exit_codes.items()))
        out.append("warning or error lines per log: " + ", ".join(
            f"{name} {len(self.log_errors.get(name, []))}" for name in self.exit_codes))
        failed = {name: sum(c.values()) for name, c in self.failed_enqueues.items()}
        out.append("failed enqueues per producer: " + ", ".join(
            f"{name} {failed.get(name, 0)}" for name in self.exit_codes if "producer" in name))
        problems = self.problems()
        out.append("checks: " + ("all passed" if not problems else f"{len(problems)} failed"))
        out += [f"  FAIL {p}" for p in problems]
        return "\n".join(out)


def export_baseline(baseline: Baseline, into: Path) -> None:
    """The baseline's ``django_xjobs`` package from this repository's history, into ``into``."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{baseline.commit}^{{commit}}"],
        capture_output=True)
    if found.returncode != 0:
        shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True).stdout.strip()
        raise Failed(
            f"commit {baseline.commit[:12]} ({baseline.description}) is not in this checkout"
            + (" (a shallow clone)" if shallow == "true" else "")
            + ": the upgrade test takes the old version from git history; fetch it with "
            "`git fetch --unshallow` (or `git fetch origin " + baseline.commit + "`)")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", baseline.commit, "django_xjobs"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def new_migrations(baseline: Baseline) -> list[str]:
    """The migrations of this tree's django_xjobs that ``baseline`` does not have."""
    def names(files: list[str]) -> set[str]:
        return {f"django_xjobs.{Path(f).stem}" for f in files
                if re.fullmatch(r"\d{4}_\w+\.py", Path(f).name)}

    old = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", baseline.commit,
                          "django_xjobs/migrations/"], check=True, capture_output=True,
                         text=True).stdout.split()
    return sorted(names([p.name for p in (ROOT / "django_xjobs/migrations").iterdir()])
                  - names(old))


class Run:
    def __init__(self, args: argparse.Namespace, work: Path, report: Report) -> None:
        self.args = args
        self.work = work
        self.report = report
        self.old_code = work / "old"
        self.processes: list[Process] = []
        url, _source = devdb.resolve()
        self.server_url = url
        self.url = devdb.with_database(url, args.database)
        self.db: psycopg.Connection[Any] | None = None
        self.migrate_window: tuple[float, float] = (0.0, 0.0)
        self.drained = False  # the run got to its end: every job should be done
        self.windows: list[tuple[str, float, float]] = []  # (migration, began, ended)

    # ---------------------------------------------------------------------- processes --
    def env(self, side: str) -> dict[str, str]:
        path = [str(self.old_code), str(ROOT)] if side == "old" else [str(ROOT)]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(path),
                "DJANGO_SETTINGS_MODULE": SETTINGS, "XJOBS_UPGRADE_DB": self.args.database,
                "XJOBS_UPGRADE_SIDE": side, "PYTHONUNBUFFERED": "1"}

    def django(self, side: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A management command of ``side``'s code, run to its end."""
        # cwd is the work directory: ``python -m`` puts the cwd first on sys.path, and the
        # checkout's own django_xjobs must not shadow the old one.
        done = subprocess.run([sys.executable, "-m", "django", *argv], cwd=self.work,
                              env=self.env(side), capture_output=True, text=True)
        if check and done.returncode != 0:
            raise Failed(f"{side} `{' '.join(argv)}` exited {done.returncode}:\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return done

    def spawn(self, side: str, role: str, argv: list[str], events: Path | None = None) -> Process:
        log = self.work / f"{side}-{role}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen([sys.executable, *argv], cwd=self.work, env=self.env(side),
                                     stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        process = Process(side, role, popen, log, events)
        self.processes.append(process)
        return process

    def worker(self, side: str, n: int) -> Process:
        return self.spawn(side, f"worker-{n}", [
            "-m", "django", "xjobs_worker", "--queue", QUEUE, "--concurrency", "4",
            "--worker-id", f"{side}-worker-{n}"])

    def producer(self, side: str) -> Process:
        events = self.work / f"{side}-producer.jsonl"
        return self.spawn(side, "producer", [
            "-m", "tests.upgrade.producer", "--by", side, "--log", str(events),
            "--rate", str(self.args.rate)], events)

    def running(self) -> None:
        """Fail when one of the processes that should be running has exited."""
        for p in self.processes:
            code = p.popen.poll()
            if code is not None and p.name not in self.report.exit_codes:
                raise Failed(f"{p.name} exited {code} on its own:\n{p.text()[-3000:]}")

    def wait(self, what: str, check: Callable[[], T | None], timeout: float = SETTLE) -> T:
        """Poll ``check`` (a read of rows, states or logs) until it returns something."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            self.running()
            if time.monotonic() > deadline:
                raise Failed(f"waited {timeout:.0f} s for {what}")
            time.sleep(0.1)  # the poll interval of the wait, not a wait for anything

    def started(self, p: Process) -> None:
        if p.events is None:
            self.wait(f"{p.name} to start", lambda: " started: " in p.text(), STARTUP)
        else:
            self.wait(f"{p.name} to start", lambda: p.events.exists()
                      and len(p.events.read_text().splitlines()) > 1, STARTUP)

    def stop(self, p: Process) -> None:
        """SIGTERM, then until the process exits by itself."""
        p.popen.send_signal(signal.SIGTERM)
        try:
            code = p.popen.wait(timeout=SETTLE)
        except subprocess.TimeoutExpired:
            raise Failed(f"{p.name} did not exit within {SETTLE:.0f} s of SIGTERM:\n"
                         f"{p.text()[-3000:]}") from None
        self.report.exit_codes[p.name] = code

    def kill_all(self) -> None:
        """Whatever is still running when the run ends early."""
        for p in self.processes:
            if p.popen.poll() is None:
                os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()

    # ------------------------------------------------------------------------- reads --
    def one(self, query: str, params: Any = None) -> Any:
        assert self.db is not None
        with self.db.cursor() as cur:
            cur.execute(query, params)
            row = cur.fetchone()
            return row[0] if row else None

    def all(self, query: str, params: Any = None) -> list[Any]:
        assert self.db is not None
        with self.db.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall()

    def ran(self, side: str, by: str | None = None, what: str = "run") -> int:
        """Executions by ``side``'s workers (of jobs ``by`` enqueued)."""
        return self.one("select count(*) from upgrade_executions where side = %s and what = %s"
                        " and (%s::text is null or by = %s)", [side, what, by, by])

    def enqueued(self, p: Process) -> list[dict[str, Any]]:
        assert p.events is not None
        lines = p.events.read_text().splitlines() if p.events.exists() else []
        return [e for e in map(json.loads, lines) if "i" in e]

    # ------------------------------------------------------------------------ phases --
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        print(f"phase {name} ...", file=sys.stderr, flush=True)
        began = time.monotonic()
        yield
        self.report.phases.append((name, time.monotonic() - began))

    def fresh(self) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as server:
            name = sql.Identifier(self.args.database)
            server.execute(sql.SQL("drop database if exists {} with (force)").format(name))
            server.execute(sql.SQL("create database {}").format(name))

    def fill(self, rows: int) -> None:
        """``rows`` finished jobs at the baseline's schema (0001), 100,000 a statement."""
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            assert self.db is not None
            self.db.execute(FILL, {"n": n, "start": start})
        self.db.execute("vacuum analyze x_jobs")  # what autovacuum would have done by now

    def body(self) -> None:
        args = self.args
        with self.phase("fresh"):
            export_baseline(BASELINES[args.baseline], self.old_code.mkdir() or self.old_code)
            self.fresh()
        with self.phase("old-migrate"):
            self.django("old", "migrate", "-v", "0")
        self.db = psycopg.connect(self.url, autocommit=True)
        with self.phase("fill"):
            self.fill(args.rows)

        with self.phase("old-fleet"):
            old = [self.worker("old", 1), self.worker("old", 2), self.producer("old")]
            for p in old:
                self.started(p)
            self.wait(f"the old workers to run {args.overlap} jobs and suspend durable runs",
                      lambda: self.ran("old") >= args.overlap
                      and self.ran("old", what="step:before") > 0)

        with self.phase("new-migrate"):
            self.migrate()

        with self.phase("mixed-fleet"):
            new = [self.worker("new", 1), self.worker("new", 2), self.producer("new")]
            for p in new:
                self.started(p)
            self.wait(f"each version's workers to run {args.overlap} jobs of the other's",
                      lambda: self.ran("new", by="old") >= args.overlap
                      and self.ran("old", by="new") >= args.overlap)

        with self.phase("stop-old"):
            for p in old:
                self.stop(p)

        with self.phase("finish-upgrade"):
            self.finish_upgrade()

        producer = new[2]
        with self.phase("new-only"):
            after = len(self.enqueued(producer)) + args.overlap
            self.wait(f"{args.overlap} more enqueues of the new producer",
                      lambda: len(self.enqueued(producer)) >= after)
            self.stop(producer)

        with self.phase("resume"):
            ids = self.job_ids()
            self.wait("every durable run suspended and every other job done", lambda: self.one(
                "select count(*) = 0 from x_jobs where id = any(%s) and not (state = 'done'"
                " or (name = 'upgradeapp.durable' and state = 'suspended'))", [ids]))
            self.django("new", "shell", "-c",
                        f"from django_xjobs import publish_event; publish_event({RESUME_EVENT!r})")
            self.wait("every job done", lambda: self.one(
                "select count(*) = 0 from x_jobs where id = any(%s) and state <> 'done'", [ids]))
            for p in new[:2]:
                self.stop(p)
        self.drained = True

    def migrate(self) -> None:
        """``migrate -v 2`` of the new code; each migration's time as Django prints it, and when
        it ran (its lines as they arrive: Django flushes "Applying X..." before it starts)."""
        began = time.time()
        popen = subprocess.Popen([sys.executable, "-m", "django", "migrate", "-v", "2"],
                                 cwd=self.work, env=self.env("new"), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
        assert popen.stdout is not None
        out, starts = "", {}
        while chunk := os.read(popen.stdout.fileno(), 65536).decode(errors="replace"):
            out += chunk
            for m in APPLYING.finditer(out):
                starts.setdefault(m[1], time.time())
        code = popen.wait()
        self.migrate_window = (began, time.time())
        self.report.expected_migrations = new_migrations(BASELINES[self.args.baseline])
        if code != 0:
            raise Failed(f"new `migrate` exited {code}:\n{out[-3000:]}")
        names = [m for m, _ in MIGRATED.findall(out)]
        # Each ends where the next begins, the last with migrate (none: nothing to apply).
        ends = [starts.get(n, 0.0) for n in names[1:]] + [self.migrate_window[1]] * bool(names)
        self.report.migrations = [(m, float(t)) for m, t in MIGRATED.findall(out)]
        self.windows = [(n, starts.get(n, began), end) for n, end in zip(names, ends, strict=True)]

    def finish_upgrade(self) -> None:
        done = self.django("new", "xjobs", "fleet", "--finish-upgrade", check=False)
        if done.returncode != 0:
            text = done.stdout + done.stderr
            if "invalid choice: 'fleet'" in text or "unrecognized arguments" in text:
                raise Failed("the new version has no `manage.py xjobs fleet --finish-upgrade` "
                             "(the x_fleet table, migration 0012, and the command that ends the "
                             "old version's compatibility are not in this tree yet)")
            raise Failed(f"`xjobs fleet --finish-upgrade` exited {done.returncode}:\n"
                         f"{text[-3000:]}")

    def job_ids(self) -> list[str]:
        return sorted({e["id"] for p in self.processes if p.events for e in self.enqueued(p)
                       if "id" in e})

    # ------------------------------------------------------------------------ checks --
    def checks(self) -> None:
        report = self.report
        for p in self.processes:
            if p.events is not None:
                events = self.enqueued(p)
                report.enqueues[p.name] = Counter(
                    e["kind"] + ("" if "error" in e else " created" if e["created"] else " found")
                    for e in events)
                report.failed_enqueues[p.name] = Counter(
                    _first_line(e["error"]) for e in events if "error" in e)
                if not report.failed_enqueues[p.name]:
                    del report.failed_enqueues[p.name]
                report.stalls[p.name] = stalls(events, self.migrate_window, self.windows)
            errors = log_errors(p.text())
            if errors:
                report.log_errors[p.name] = errors
        if self.db is None:
            return
        ids = self.job_ids()
        report.jobs = len(ids)
        # A run that stopped early left jobs unfinished: only what ran twice is known then.
        report.lost = [f"{i} {name} {state}: {error}" for i, name, state, error in self.all(
            "select g.id, j.name, coalesce(j.state, 'missing'), j.last_error"
            " from unnest(%s::uuid[]) g(id) left join x_jobs j on j.id = g.id"
            " where j.state is distinct from 'done' order by 1", [ids])] if self.drained else []
        # A job's code runs once per attempt; a step's body runs once per job (its output is
        # stored and replayed); a plain or limited job runs once, at attempt 1: a second
        # attempt means a run failed or was lost.
        report.twice = [f"{job} {what} x{n} at attempts {attempts} (by {sides})"
                        for job, what, n, attempts, sides in self.all(
            "select job_id, what, count(*), string_agg(attempt::text, ',' order by id),"
            "       string_agg(side || ' pid ' || pid, ', ' order by id)"
            " from upgrade_executions group by job_id, what,"
            "          case when what = 'run' then attempt end"
            " having count(*) > 1 order by 1")]
        report.twice += [f"{job} ran at attempt {attempt} ({side})" for job, attempt, side in
                         self.all("select job_id, attempt, side from upgrade_executions"
                                  " where what = 'run' and attempt > 1")]
        report.executions = dict(self.all(
            "select side, count(*) from upgrade_executions where what in ('run', 'step:after')"
            " group by 1"))
        report.cross = {f"{side} ran {by}'s": n for side, by, n in self.all(
            "select side, by, count(*) from upgrade_executions where what in ('run', 'step:after')"
            " and side <> by group by 1, 2")}
        durable = [i for i, in self.all(
            "select id from x_jobs where id = any(%s) and name = 'upgradeapp.durable'", [ids])]
        steps = {(str(job), what): side for job, what, side in self.all(
            "select job_id, what, min(side) from upgrade_executions where job_id = any(%s)"
            " group by 1, 2", [durable])}
        report.not_resumed = [str(i) for i in durable if (str(i), "step:after") not in steps
                              ] if self.drained else []
        report.durable_suspended_old = sum(steps.get((str(i), "step:before")) == "old"
                                           for i in durable)
        report.durable_resumed_new = sum(
            steps.get((str(i), "step:before")) == "old" and steps.get((str(i), "step:after"))
            == "new" for i in durable)


FILL = """
insert into x_jobs (id, name, queue, input, idempotency_key, run_id, state, run_at, created_at,
                    updated_at, started_at, finished_at, attempt, claimed_by)
select g.id, 'upgradeapp.plain', 'upgrade', jsonb_build_object('by', 'fill', 'n', g.n),
       g.id::text, gen_random_uuid(), 'done', g.at, g.at, g.at, g.at, g.at, 1, 'fill'
  from (select gen_random_uuid() as id, n,
               now() - interval '1 day' + n * interval '1 millisecond' as at
          from generate_series(%(start)s + 1, %(start)s + %(n)s) as n) g
"""
# Django's `migrate -v 2`: "  Applying django_xjobs.0002_job_view_query_text... OK (0.123s)"
MIGRATED = re.compile(r"Applying (\S+)\.\.\. OK \(([\d.]+)s\)")
APPLYING = re.compile(r"Applying (\S+)\.\.\.")
# Every job here succeeds at its first attempt: a failed attempt (a WARNING) is a problem too.
LOG_ERROR = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")


def log_errors(text: str) -> list[str]:
    """A log's warning and error lines; a traceback is shown by its exception's line (the
    first line after it that is not indented), so that the report names what was raised."""
    lines = text.splitlines()
    found = []
    for n, line in enumerate(lines):
        if not LOG_ERROR.search(line):
            continue
        if line.startswith("Traceback"):
            raised = next((after for after in lines[n + 1:]
                           if after and not after[0].isspace()), "(no exception line)")
            line = f"{line} -> {raised}"
        found.append(line)
    return found


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def stalls(events: list[dict[str, Any]], window: tuple[float, float],
           migrations: list[tuple[str, float, float]]) -> dict[str, Any]:
    """The longest enqueue (ms), the longest that overlapped ``migrate`` and the migration(s)
    running while it waited, the 99th percentile."""
    ms = sorted(e["ms"] for e in events)

    def overlaps(e: dict[str, Any], began: float, ended: float) -> bool:
        return e["at"] <= ended and e["at"] + e["ms"] / 1000 >= began

    during = [e for e in events if overlaps(e, *window)]
    longest = max(during, key=lambda e: e["ms"], default=None)
    return {"max": ms[-1] if ms else 0.0, "migrate": longest["ms"] if longest else 0.0,
            "p99": ms[int(len(ms) * 0.99)] if ms else 0.0,
            "behind": ", ".join(name.split(".", 1)[-1] for name, began, ended in migrations
                                if longest and overlaps(longest, began, ended))}


def run(argv: list[str] | None = None) -> Report:
    """Run the upgrade test with the command line ``argv``; its report."""
    args = parser().parse_args(argv)
    report = Report(baseline=f"{args.baseline} ({BASELINES[args.baseline].commit[:7]})",
                    rows=args.rows)
    with tempfile.TemporaryDirectory(prefix="xjobs-upgrade-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        upgrade = Run(args, work, report)
        try:
            upgrade.body()
        except Failed as exc:
            report.failure = str(exc)
        finally:
            upgrade.kill_all()
            try:
                upgrade.checks()
            finally:
                if upgrade.db is not None:
                    upgrade.db.close()
    return report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.upgrade.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000,
                   help="finished jobs in x_jobs before the upgrade (default 1,000,000)")
    p.add_argument("--overlap", type=int, default=200,
                   help="jobs each version's workers run of the other's while both run, and "
                   "the size of the other waits in jobs (default 200)")
    p.add_argument("--rate", type=float, default=50.0, help="enqueues per second per producer")
    p.add_argument("--baseline", choices=sorted(BASELINES), default=DEFAULT)
    p.add_argument("--database", default="xjobs_upgrade", help="dropped and made afresh")
    p.add_argument("--keep", metavar="DIR", help="keep the logs in DIR (default: deleted)")
    return p


def main() -> None:
    report = run()
    print(report.text())
    sys.exit(2 if report.failure else 1 if report.problems() else 0)


if __name__ == "__main__":
    main()
