"""XJOBS["SHARDS"], ["TENANT_SHARDS"], ["READ_DATABASE"] and the jobs alias in use (conf.py,
shards.py; docs/scaling.md). The routing itself, on three real servers, is
tests/acceptance/test_shards.py."""

from __future__ import annotations

import re

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_xjobs import conf, shards
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.models import Job
from django_xjobs.routers import XJobsRouter

SHARDED = {"SHARDS": ["default", "b", "c"], "TENANT_SHARDS": {"acme": "b", "globex": "c"}}


def shard_of(tenant_id: str) -> str | None:
    """A TENANT_SHARDS function for the tests: by the tenant's first letter."""
    return {"x": "c", "y": "nowhere"}.get(tenant_id[0])


def test_the_shards_put_the_home_database_first_and_refuse_what_is_no_list_of_aliases():
    assert conf.build({}).job_databases == ("default",)
    assert conf.build({}).shards == ()
    assert conf.build({"DATABASE": "b", "SHARDS": ["a", "b"]}).shards == ("b", "a")
    for bad, fragment in (("a", "must be a list of database aliases"),
                          ([], "must be a list of database aliases"),
                          (["default", ""], "is not a database alias"),
                          (["default", "b", "b"], "repeats an alias"),
                          (["b", "c"], r'must list XJOBS\["DATABASE"\] \(\'default\'\)')):
        with pytest.raises(ConfigurationError, match=fragment):
            conf.build({"SHARDS": bad})


def test_tenant_shards_name_shards_and_need_them():
    with pytest.raises(ConfigurationError, match=r'needs XJOBS\["SHARDS"\]'):
        conf.build({"TENANT_SHARDS": {"acme": "default"}})
    with pytest.raises(ConfigurationError, match=r"tenant 'acme' -> 'z'.*one of"):
        conf.build({**SHARDED, "TENANT_SHARDS": {"acme": "z"}})
    with pytest.raises(ConfigurationError, match="dotted path"):
        conf.build({**SHARDED, "TENANT_SHARDS": "shard_of"})
    with pytest.raises(ConfigurationError, match=r"READ_DATABASE.*\['z'\], which hold no job"):
        conf.build({**SHARDED, "READ_DATABASE": {"z": "z_replica"}})


def test_a_tenant_lives_on_its_shard_and_everything_else_at_home():
    with override_settings(XJOBS=SHARDED):
        assert conf.shard_for_tenant("acme") == "b"
        assert conf.shard_for_tenant("globex") == "c"
        assert conf.shard_for_tenant("initech") == "default"
        assert conf.shard_for_tenant(None) == "default"
    by_function = {**SHARDED, "TENANT_SHARDS": f"{__name__}.shard_of"}
    with override_settings(XJOBS=by_function):
        assert conf.shard_for_tenant("xerox") == "c"
        assert conf.shard_for_tenant("acme") == "default"  # the function said None
        with pytest.raises(ConfigurationError, match="placed tenant 'yak' on 'nowhere'"):
            conf.shard_for_tenant("yak")
    with override_settings(XJOBS={**SHARDED, "TENANT_SHARDS": f"{__name__}.absent"}), \
            pytest.raises(ConfigurationError, match="cannot import"):
        conf.shard_for_tenant("acme")


def test_using_a_shard_changes_the_alias_in_use_and_nothing_else():
    with override_settings(XJOBS={**SHARDED, "LISTEN_DATABASE": {"b": "b_direct"},
                                  "READ_DATABASE": {"c": "c_replica"}, "LEASE": "40s"}):
        assert conf.get().database == "default"
        with conf.using_database("b") as settings:
            assert (settings.database, settings.listen_database, settings.lease) == (
                "b", "b_direct", 40.0)
            assert conf.get() is settings
            with conf.using_database("c_replica"):  # a replica is an alias in use too
                assert conf.get().database == "c_replica"
            assert conf.get().read_database is None
        with conf.using_database("c"):
            assert conf.get().read_database == "c_replica"
        assert conf.get().database == "default"
        with pytest.raises(ConfigurationError, match=r"'z' holds no job tables.*replicas"):
            conf.get()  # the settings are fine ...
            with conf.using_database("z"):  # ... the alias is not
                pass


def test_the_router_migrates_the_job_tables_onto_every_shard_only():
    router = XJobsRouter()
    with override_settings(XJOBS=SHARDED):
        assert [router.allow_migrate(db, "django_xjobs", "job") for db in
                ("default", "b", "c", "other")] == [True, True, True, False]
        assert router.allow_migrate("b", "django_xjobs", "outboxentry") is False
        with conf.using_database("b"):
            assert router.db_for_read(Job) == "b"


# Aliases the tests' settings have, so that the system checks pass and the command judges.
REAL = {"SHARDS": ["default", "jobs"]}


@pytest.mark.parametrize(("xjobs", "args", "message"), [
    ({}, ["--shard", "b"], "--shard b: not a shard; the shards are default"),
    (REAL, ["--shard", "z"], "--shard z: not a shard; the shards are default, jobs"),
    (REAL, ["--shard", "jobs", "--shard", "jobs"], "--shard repeats an alias: jobs jobs"),
    (REAL, ["--health-file", "/tmp/h"], "with several shards run one xjobs_worker --shard"),
])
def test_the_worker_refuses_a_shard_it_cannot_work(xjobs, args, message):
    with override_settings(XJOBS=xjobs, DATABASE_ROUTERS=["django_xjobs.routers.XJobsRouter"]), \
            pytest.raises(CommandError, match=re.escape(message)):
        call_command("xjobs_worker", *args)


def test_a_shard_that_fails_leaves_the_alias_in_use_as_it_was():
    def fail_on_jobs():
        if conf.get().database == "jobs":
            raise RuntimeError("jobs is down")
        return conf.get().database

    with override_settings(XJOBS=REAL), conf.using_database("jobs"):
        with pytest.raises(RuntimeError, match="jobs is down"):
            shards.each_shard(fail_on_jobs)
        assert conf.get().database == "jobs"
        assert shards.first(lambda: None) is None  # every shard asked, nothing found
        assert conf.get().database == "jobs"
    assert conf.get().database == "default"


@pytest.mark.parametrize(("args", "message"), [
    (["schedule", "--shard", "z"], "--shard z: not a shard; the shards are default, jobs"),
    (["schedule", "--shard", "jobs"], "--shard jobs: the schedule fires on the home shard"),
])
def test_the_schedule_commands_act_on_the_home_shard_only(args, message):
    with override_settings(XJOBS=REAL, DATABASE_ROUTERS=["django_xjobs.routers.XJobsRouter"]), \
            pytest.raises(CommandError, match=re.escape(message)):
        call_command("xjobs", *args)
