"""``manage.py xjobs check-deploy`` on hand-written step rows (docs/durable.md, "The deploy
check"): which runs it replays, how it compares kinds (old rows without one included), child
jobs, async jobs, what it reports and its exit code. The end-to-end case, a run a real worker
suspended, is tests/acceptance/test_deploy_check.py."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_xjobs import deploycheck
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job, JobStep
from django_xjobs.records import StepRecord
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db


def check(*args: str) -> tuple[int, str]:
    """(exit code, stdout) of ``manage.py xjobs check-deploy ARGS``."""
    out = StringIO()
    try:
        call_command("xjobs", "check-deploy", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def check_json(*args: str) -> tuple[int, dict[str, Any]]:
    code, text = check("--json", *args)
    return code, json.loads(text)


def suspended(name: str, steps: list[tuple], *, state: str = "suspended",
              blocked_resume: bool = False, input: Any = None) -> Job:
    """A job row waiting in ``state`` with ``steps`` recorded in this order: (name, status,
    kind, output) and optionally a dict of further columns."""
    job = Job.objects.create(name=name, idempotency_key=str(uuid.uuid4()), state=state,
                             blocked_resume=blocked_resume, attempt=1,
                             input={} if input is None else input)
    for step in steps:
        step_name, status, kind, output, *more = step
        JobStep.objects.create(run_id=job.run_id, name=step_name, status=status, kind=kind,
                               output=output, **(more[0] if more else {}))
    return job


def flow_a(job_name: str = "testapp.deploy_flow", **options: Any) -> Job:
    """deploy_flow's version A, suspended in its nap."""
    return suspended(job_name, [("a", "completed", "run", {"n": 1}),
                                ("nap", "sleeping", "sleep", None,
                                 {"wake_at": timezone.now() + timedelta(hours=1)})], **options)


@pytest.fixture
def version(monkeypatch):
    def use(name: str) -> None:
        monkeypatch.setenv("XJOBS_TEST_FLOW_VERSION", name)
    use("A")
    return use


def only_verdict(*args: str) -> tuple[int, dict[str, Any]]:
    code, data = check_json(*args)
    [verdict] = data["runs"]
    return code, verdict


# ------------------------------------------------------------------------------ the path --


def test_the_code_that_recorded_the_run_reaches_the_same_steps_and_exits_0(version):
    flow_a()
    code, text = check()
    assert code == 0, text
    assert "1 suspended durable run(s) replayed" in text and "none would" in text


def test_a_renamed_step_diverges_and_names_the_step(version):
    job = flow_a()
    version("B")
    code, text = check()
    assert code == 1
    assert f"DIVERGES  job {job.id} (testapp.deploy_flow): step 1: recorded 'a' " \
           "(run), the code reached 'a-renamed' (run)" in text


def test_a_step_of_another_kind_diverges(version):
    flow_a()
    version("kind")
    code, verdict = only_verdict()
    assert code == 1
    assert (verdict["position"], verdict["expected"], verdict["expected_kind"],
            verdict["reached"], verdict["reached_kind"]) == (1, "a", "run", "a", "sleep")


def test_returning_before_a_recorded_step_diverges(version):
    flow_a()
    version("early")
    code, verdict = only_verdict()
    assert code == 1
    assert verdict["reason"] == ("step 2: recorded 'nap' (sleep), the code returned before "
                                 "reaching it")
    assert verdict["reached"] is None


def test_an_exception_outside_steps_is_reported(version):
    flow_a()
    version("raise")
    code, verdict = only_verdict()
    assert code == 1
    assert verdict["reason"] == ("step 2: recorded 'nap' (sleep), the code raised ValueError: "
                                 "the new code breaks before the nap before reaching it")


def test_changes_after_the_step_the_run_waits_in_pass_and_writes_between_steps_vanish(version):
    flow_a()
    version("C")
    code, text = check()
    assert code == 0, text
    assert not Effect.objects.filter(kind="outside").exists()
    assert not Job.objects.filter(name="testapp.record").exists()


def test_a_step_beyond_a_fully_completed_record_ends_the_replay(version):
    # Every recorded step completed (the run was woken but not yet resumed): the code's next
    # step is new ground, nothing to compare.
    suspended("testapp.deploy_flow", [
        ("a", "completed", "run", {"n": 1}),
        ("nap", "completed", "sleep", None, {"wake_at": timezone.now()})])
    assert check()[0] == 0


def test_a_replay_hands_back_the_recorded_output_and_never_calls_the_function(version):
    # deploy_flow takes a step "a-was-not-replayed" when "a" does not hand back {"n": 1}.
    suspended("testapp.deploy_flow", [
        ("a", "completed", "run", {"n": 2}),
        ("nap", "sleeping", "sleep", None, {"wake_at": timezone.now()})])
    code, verdict = only_verdict()
    assert (code, verdict["expected"], verdict["reached"]) == (1, "nap", "a-was-not-replayed")
    assert not Effect.objects.exists()


def test_code_that_swallows_the_end_of_the_replay_cannot_change_the_verdict():
    suspended("testapp.deploy_loose", [("zero", "completed", "run", None),
                                                  ("first", "sleeping", "sleep", None)])
    code, verdict = only_verdict()
    assert code == 1
    assert (verdict["expected"], verdict["reached"]) == ("zero", "first")


def test_a_job_no_longer_registered_diverges():
    job = suspended("gone.job", [("a", "sleeping", "sleep", None)])
    code, verdict = only_verdict()
    assert code == 1
    assert verdict["job_id"] == str(job.id)
    assert verdict["reason"] == "job no longer exists: no job named 'gone.job' is registered"


def test_async_jobs_are_replayed_too(version):
    suspended("testapp.async_deploy_flow", [("a", "completed", "run", {"n": 1}),
                                                       ("nap", "sleeping", "sleep", None)])
    assert check()[0] == 0
    version("B")
    code, verdict = only_verdict()
    assert (code, verdict["expected"], verdict["reached"]) == (1, "a", "a-renamed")


# ------------------------------------------------------------------------------- kinds --


def test_rows_written_before_kinds_were_recorded_are_inferred(version):
    # kind NULL: a completed row without wake_at ran a function, a sleeping row sleeps.
    suspended("testapp.deploy_flow", [
        ("a", "completed", None, {"n": 1}),
        ("nap", "sleeping", None, None, {"wake_at": timezone.now()})])
    assert check()[0] == 0
    version("kind")
    code, verdict = only_verdict()
    assert (code, verdict["expected_kind"], verdict["reached_kind"]) == (1, "run", "sleep")


def test_the_inferred_kinds_of_old_rows():
    def kinds(**columns: Any) -> tuple[str, ...]:
        row = {"name": "s", "status": "completed", "output": None, "attempts": 1, "error": None,
               "started_at": None, "completed_at": None, "wake_at": None, "event": None,
               "correlation_key": None, "event_id": None, "event_published_at": None,
               **columns}
        return deploycheck.recorded_kinds(StepRecord(**row))

    now = timezone.now()
    assert kinds() == ("run",)
    assert kinds(kind="invoke") == ("invoke",)
    assert kinds(status="sleeping", wake_at=now) == ("sleep",)
    assert kinds(status="waiting", wake_at=now, event="paid") == ("event", "event_any")
    assert kinds(status="waiting", wake_at=now) == ("event_any",)
    assert kinds(wake_at=now) == ("sleep", "event", "event_any")  # a sleep, or a timed-out wait
    assert kinds(status="invoking") == ("invoke",)


def test_wait_for_any_rows_of_each_event_are_not_steps():
    suspended("testapp.any_waiter", [
        ("race", "waiting", "event_any", None),
        ("race#a", "waiting", "event", None, {"event": "a"}),
        ("race#b", "waiting", "event", None, {"event": "b"})])
    code, verdict = only_verdict()
    assert (code, verdict["recorded"]) == (0, 1)


# --------------------------------------------------------------------------- child jobs --


def children(many: dict[str, Any], got: str, *, last: str = "invoking") -> Job:
    return suspended("testapp.deploy_children", [
        ("one", "completed", "invoke", {"children": ["c1"], "results": [7]}),
        ("many", "completed", "invoke", many),
        (got, "completed", "run", None),
        ("last", last, "invoke", None)])


def test_invoke_and_gather_hand_back_their_children_results(version):
    children({"children": ["c2", "c3"], "results": [1, 2]}, "got-7-all-1-2")
    assert check()[0] == 0
    version("kind")  # the run waits in an invoke, the code now sleeps there
    code, verdict = only_verdict()
    assert (code, verdict["position"], verdict["expected_kind"], verdict["reached_kind"]) == \
        (1, 4, "invoke", "sleep")


def test_a_failed_child_is_raised_again_as_child_failed():
    failed = {"children": ["c2", "c3"],
              "failed": {"index": 1, "id": "c3", "state": "dead", "error": "boom"}}
    children(failed, "got-7-failed-1-dead-c3")
    assert check()[0] == 0


def test_a_gather_that_now_succeeds_where_it_failed_diverges():
    children({"children": ["c2", "c3"], "results": [1, 2]}, "got-7-failed-1-dead-c3")
    code, verdict = only_verdict()
    assert (code, verdict["expected"], verdict["reached"]) == \
        (1, "got-7-failed-1-dead-c3", "got-7-all-1-2")


# ---------------------------------------------------------------- which runs, the report --


def test_no_suspended_runs_exit_0():
    suspended("testapp.deploy_flow", [], state="suspended")  # no step: not a run
    suspended("testapp.deploy_flow", [("a", "completed", "run", None)],
              state="ready")
    suspended("testapp.deploy_flow", [("a", "completed", "run", None)],
              state="blocked")  # blocked before it ever ran durably
    assert check() == (0, "check-deploy: no suspended durable run to check\n")
    assert check_json() == (0, {"checked": 0, "diverging": 0, "runs": []})


def test_a_blocked_run_whose_resume_is_held_back_is_checked(version):
    job = flow_a(state="blocked", blocked_resume=True)
    version("B")
    code, verdict = only_verdict()
    assert (code, verdict["job_id"], verdict["state"]) == (1, str(job.id), "blocked")


def test_json_lists_every_run_with_its_verdict(version):
    ok = flow_a()
    gone = suspended("gone.job", [("a", "sleeping", "sleep", None)])
    code, data = check_json()
    assert code == 1
    assert (data["checked"], data["diverging"]) == (2, 1)
    runs = {r["job_id"]: r for r in data["runs"]}
    assert runs[str(ok.id)] == {
        "job_id": str(ok.id), "name": "testapp.deploy_flow", "run_id": str(ok.run_id),
        "state": "suspended", "recorded": 2, "diverges": False, "reason": None,
        "position": None, "expected": None, "expected_kind": None, "reached": None,
        "reached_kind": None}
    assert runs[str(gone.id)]["diverges"] is True


def test_job_and_limit_choose_the_runs(version):
    flow_a()
    flow_a()
    suspended("gone.job", [("a", "sleeping", "sleep", None)])
    assert check_json("--job", "testapp.deploy_flow")[1]["checked"] == 2
    assert check_json("--job", "gone.job")[1]["diverging"] == 1
    assert check_json("--limit", "1")[1]["checked"] == 1
    assert check_json("--job", "nothing.here")[1]["checked"] == 0


def test_paging_reads_every_run(monkeypatch, version):
    monkeypatch.setattr(deploycheck, "PAGE", 2)
    made = sorted(str(flow_a().id) for _ in range(5))
    assert [v.job_id for v in deploycheck.check()] == made
    assert [v.job_id for v in deploycheck.check(limit=3)] == made[:3]


def test_an_undecodable_or_non_object_input_is_reported():
    suspended("testapp.deploy_flow", [("a", "completed", "run", {"n": 1})],
              input=[1, 2])
    code, verdict = only_verdict()
    assert code == 1
    assert verdict["reason"] == ("its stored input cannot be passed to the code: it is a list, "
                                 "not a JSON object")


def test_bad_arguments_are_refused_as_bad_usage():
    with pytest.raises(CommandError, match="--limit must be at least 1") as info:
        call_command("xjobs", "check-deploy", "--limit", "0")
    assert info.value.returncode == 2
    with pytest.raises(InvalidJobInput, match="limit must be an integer >= 1"):
        deploycheck.check(limit=0)
    with pytest.raises(CommandError, match="job name") as info:
        call_command("xjobs", "check-deploy", "--job", "")
    assert info.value.returncode == 2


def test_verbosity_2_also_lists_the_runs_that_pass_and_json_is_taken_before_the_action(version):
    job = flow_a()
    # Django's -v, before the subcommand, after it (as docs/durable.md writes it), or given
    # by name: the same.
    given = [(("-v", "2", "check-deploy"), {}), (("check-deploy", "-v", "2"), {}),
             (("check-deploy", "--verbosity=2"), {}), (("check-deploy",), {"verbosity": 2})]
    for args, options in given:
        out = StringIO()
        call_command("xjobs", *args, stdout=out, **options)
        assert f"ok        job {job.id} (testapp.deploy_flow): 2 recorded step(s) reached in " \
               "order" in out.getvalue(), args
    out = StringIO()
    call_command("xjobs", "check-deploy", "-v", "1", stdout=out)  # the runs that pass: not listed
    assert "ok        job" not in out.getvalue()
    out = StringIO()
    call_command("xjobs", "--json", "check-deploy", stdout=out)
    assert json.loads(out.getvalue())["checked"] == 1
