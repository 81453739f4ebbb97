"""The package as a user gets it, and the deployment examples as an operator runs them.

* The wheel (built offline from a copy of the sources by ``pip wheel --no-deps
  --no-build-isolation``) passes the checks ``make release`` runs on a release's wheel
  (tests/release_check.py: the license, ``py.typed``, the templates, the static files, the
  migrations, the metadata; nothing of the checkout's tools); installed into a fresh
  virtualenv it runs the quickstart of docs/pypi.md in a new project: migrate, check, enqueue,
  ``xjobs_worker --burst``, done.
* Each example of docs/deployment.md is read from the page and its command line run against a
  real project and database: the systemd unit's ``ExecStart`` (for a burst, and stopped the way
  its ``KillMode`` makes systemd stop it), the Procfile's ``release`` and ``worker``, the
  Dockerfile's ``CMD`` with its ``ENV``, the Kubernetes Deployment's ``command``.

Every process is real; nothing reaches a network (the wheel's dependencies are the ones this
test runs with, made visible to the new virtualenv by a ``.pth`` file).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from tests.release_check import (
    STEP_TIMEOUT,
    Project,
    new_project,
    quickstart,
    scratch_database_url,
    wheel_problems,
)

pytestmark = pytest.mark.acceptance

@contextmanager
def fresh_database_url(suffix: str) -> Iterator[str]:
    """The URL of a database of its own (named after this run's test database), dropped at the
    end."""
    from django.conf import settings

    name = f"{settings.DATABASES['default']['TEST']['NAME']}_{suffix}"
    # tests/settings.py sets DATABASE_URL
    with scratch_database_url(os.environ["DATABASE_URL"], name) as url:
        yield url


@contextmanager
def fresh_database(suffix: str) -> Iterator[dict]:
    """:func:`fresh_database_url` as a ``DATABASES`` entry."""
    from tests import devdb

    with fresh_database_url(suffix) as url:
        yield devdb.settings_from_url(url)


# ---------------------------------------------------------------------------------- the wheel --


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of what a release is built from (the checkout stays clean:
    setuptools writes build/ and *.egg-info next to the sources)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "LICENSE", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, src / name)
    for tree in ("django_xjobs", "docs"):
        shutil.copytree(ROOT / tree, src / tree,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--wheel-dir", str(out), str(src)],
        check=True, capture_output=True, text=True, timeout=STEP_TIMEOUT,
    )
    (built,) = out.glob("django_xjobs-*.whl")
    return built


def test_the_wheel_holds_the_package_its_data_and_license_and_nothing_else(wheel):
    # The checks make release runs on the release's wheel (tests/release_check.py): the
    # templates, static files, migrations, py.typed and the license; no top-level entry beside
    # the package (tests/, example_project/, bench/, tests/devdb.py); METADATA with
    # conf.VERSION and docs/pypi.md as the long description.
    assert (ROOT / "tests" / "devdb.py").is_file()
    assert wheel_problems(wheel) == []


def test_the_wheel_check_finds_what_is_missing(wheel, tmp_path):
    # The check can fail: the same wheel less one migration, plus a tests/ module, is refused.
    broken = tmp_path / wheel.name
    migration = "django_xjobs/migrations/0001_initial.py"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            if item.filename != migration:
                dst.writestr(item, src.read(item))
        dst.writestr("tests/devdb.py", "")
    problems = wheel_problems(broken)
    assert any(migration in p for p in problems), problems
    assert any("'tests'" in p for p in problems), problems
    assert any("devdb.py" in p for p in problems), problems


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> str:
    """A fresh virtualenv with the wheel installed (no pip inside: this interpreter's pip installs
    into it), and this test run's dependencies visible to it, after its own site-packages."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=STEP_TIMEOUT)
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                    "--no-index", "--quiet", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=STEP_TIMEOUT,
    ).stdout.strip()
    # A path line in a .pth file adds the directory only: this run's editable install of the
    # checkout (itself a .pth in that directory) is not activated by it.
    Path(site, "test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_installed_wheel_runs_the_quickstart_in_a_new_project(installed, tmp_path):
    with fresh_database("package") as database:
        quickstart(new_project(tmp_path / "shop", installed, database), installed)


# ------------------------------------------------------------------- docs/deployment.md --


def example(heading: str) -> str:
    """The first code block under ``## <heading>`` of docs/deployment.md."""
    doc = (ROOT / "docs/deployment.md").read_text()
    section = doc.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.S)
    assert block, f"no example under ## {heading}"
    return block.group(1)


def systemd_service() -> dict[str, list[str]]:
    """The [Service] section of the unit: each key with its values (Environment= repeats)."""
    service: dict[str, list[str]] = {}
    section = ""
    for line in example("systemd").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, value = line.split("=", 1)
            service.setdefault(key, []).append(value)
    return service


def systemd_argv_and_env(service: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    (exec_start,) = service["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0].endswith("/bin/python") and argv[1] == "manage.py", argv
    env = dict(pair.split("=", 1) for value in service.get("Environment", [])
               for pair in shlex.split(value))
    return [sys.executable, *argv[1:]], env


def python_argv(argv: list[str]) -> list[str]:
    """A documented command line, with this test's interpreter as its ``python``."""
    assert argv[:2] == ["python", "manage.py"], argv
    return [sys.executable, *argv[1:]]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> Iterator[Project]:
    """The project, migrated by the Procfile's release command (the migration step of a deploy),
    run by this test's own interpreter and its installed django-xjobs."""
    with fresh_database("deploy") as database:
        project = new_project(tmp_path_factory.mktemp("deploy") / "shop", sys.executable,
                              database)
        project.run(*python_argv(shlex.split(procfile()["release"])), python=False)
        yield project


def procfile() -> dict[str, str]:
    return dict(line.split(":", 1) for line in example("Procfile").splitlines() if line.strip())


def burst(project: Project, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run a documented worker command line for a burst and see its job done."""
    job_id = project.enqueue("add.enqueue(a=20, b=22)")
    project.run(*argv, "--burst", python=False, env=env)
    job = project.job(job_id)
    assert (job["state"], job["result"]) == ("done", {"sum": 42}), job


def test_the_systemd_units_execstart_runs_the_worker(deployed):
    argv, env = systemd_argv_and_env(systemd_service())
    burst(deployed, argv, env)


@pytest.mark.parametrize("kill_mode", ["the unit's", "control-group"])
def test_systemd_stops_the_unit_gracefully_within_its_timeout(deployed, tmp_path, kill_mode):
    # systemd's default KillMode (control-group) signals every process of the unit: with
    # --processes, each worker process gets the SIGTERM twice (directly and forwarded by the
    # supervisor), and must still stop gracefully. The unit's KillMode (mixed, recommended)
    # signals the supervisor only.
    from django_xjobs import conf

    service = systemd_service()
    if kill_mode == "control-group":
        service["KillMode"] = ["control-group"]
    argv, env = systemd_argv_and_env(service)
    timeout = int(service["TimeoutStopSec"][0])
    assert timeout > conf.build({}).shutdown_grace + 5
    started = tmp_path / "started"
    job_id = deployed.enqueue(f"nap.enqueue(seconds=2, started={str(started)!r})")
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(argv, cwd=deployed.path, env={**deployed.env, **env},
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Started, not only claimed: a stop hands claimed-but-unstarted jobs back.
        wait_until(started.exists, timeout=STEP_TIMEOUT, interval=0.1,
                   message="the nap job to start")
        kill_mode = service.get("KillMode", ["control-group"])[-1]
        if kill_mode in ("mixed", "process"):
            worker.send_signal(signal.SIGTERM)  # the main process only
        else:
            os.killpg(worker.pid, signal.SIGTERM)  # every process of the unit
        code = worker.wait(timeout=timeout)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.close()
    output = (tmp_path / "worker.log").read_text()
    assert code == 0, output
    job = deployed.job(job_id)
    assert (job["state"], job["result"]) == ("done", {"slept": 2}), output


def test_the_procfiles_worker_runs(deployed):
    burst(deployed, python_argv(shlex.split(procfile()["worker"])))


def test_the_dockerfiles_cmd_runs_with_its_env(deployed):
    lines = example("Docker").splitlines()
    cmd = [json.loads(line.split(None, 1)[1]) for line in lines if line.startswith("CMD ")]
    assert len(cmd) == 1, "CMD in exec form (a JSON array): the worker must be PID 1"
    assert not [line for line in lines if line.startswith("ENTRYPOINT")]
    env: dict[str, str] = {}
    for line in lines:
        if line.startswith("ENV "):
            env.update(pair.split("=", 1) for pair in shlex.split(line[4:]))
    burst(deployed, python_argv(cmd[0]), env)


def test_the_kubernetes_deployments_command_runs_and_its_grace_period_covers_the_shutdown(
        deployed, tmp_path):
    from django_xjobs import conf

    manifest = example("Kubernetes")
    grace = int(re.search(r"terminationGracePeriodSeconds: (\d+)", manifest).group(1))
    assert grace > conf.build({}).shutdown_grace + 5
    command = json.loads(re.search(r"command: (\[.*\])", manifest).group(1))
    env = dict(re.findall(r"\{name: (\w+), value: ([\w.]+)\}", manifest))
    assert env == {"DJANGO_SETTINGS_MODULE": "shop.settings"}
    # Its health file in the test's directory, not the machine's /tmp.
    health_file = tmp_path / "xjobs-alive"
    command = [str(health_file) if arg == "/tmp/xjobs-alive" else arg for arg in command]
    burst(deployed, python_argv(command), env)
    assert health_file.exists() == ("--health-file" in command)
