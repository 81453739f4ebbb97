"""The package as a user gets it, and the deployment examples as an operator runs them.

* The wheel (built offline from a copy of the sources, as ``pip wheel --no-deps
  --no-build-isolation`` does for a release) holds the license, ``py.typed``, the templates,
  the static files and the migrations; installed into a fresh virtualenv it runs the quickstart
  of docs/pypi.md in a new project: migrate, check, enqueue, ``xjobs_worker --burst``, done.
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
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until

pytestmark = pytest.mark.acceptance

STEP_TIMEOUT = 180  # seconds one command may take on a loaded machine: a bound, not a measure

JOBS_PY = '''\
import time
from pathlib import Path

from django_xjobs import job


@job
def add(ctx, a: int, b: int) -> dict:
    return {"sum": a + b}


@job
def nap(ctx, seconds: float, started: str) -> dict:
    Path(started).write_text(str(ctx.attempt))
    time.sleep(seconds)  # ignores ctx.cancelled: only a graceful stop lets it finish
    return {"slept": seconds}
'''

MANAGE_PY = '''\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
'''

URLS_PY = '''\
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
'''


def quickstart_line(name: str) -> str:
    """The line of docs/pypi.md that contains ``name``, without its comment: the test runs
    what the page says."""
    lines = [line for line in (ROOT / "docs/pypi.md").read_text().splitlines() if name in line]
    assert lines, f"docs/pypi.md has no line with {name!r}"
    return lines[0].split("#", 1)[0].strip()


def quickstart_command(name: str) -> list[str]:
    """A ``python manage.py ...`` command of docs/pypi.md, as arguments of the python."""
    argv = shlex.split(quickstart_line(name))
    assert argv[:2] == ["python", "manage.py"], argv
    return argv[1:]


def settings_py(database: dict) -> str:
    return f'''\
SECRET_KEY = "package-test-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["localhost"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "shop",
]
{quickstart_line("INSTALLED_APPS +=")}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {{"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]}},
}}]
ROOT_URLCONF = "shop.urls"
DATABASES = {{"default": {database!r}}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
'''


@dataclass
class Project:
    """A new Django project ``shop`` in a directory of its own, on a database of its own."""

    path: Path
    python: str
    env: dict[str, str]
    database: dict

    def run(self, *argv: str, python: bool = True, env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [self.python, *argv] if python else list(argv)
        done = subprocess.run(command, cwd=self.path, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=STEP_TIMEOUT)
        if check and done.returncode != 0:
            pytest.fail(f"{shlex.join(command)} exited {done.returncode}:\n"
                        f"{done.stdout}\n{done.stderr}")
        return done

    def enqueue(self, call: str) -> str:
        """``shop.jobs.<call>`` enqueued by ``manage.py shell``: the new job's id."""
        out = self.run("manage.py", "shell", "-c",
                       f"from shop import jobs; print(jobs.{call}.id)").stdout
        return out.strip().splitlines()[-1]

    def job(self, job_id: str) -> dict:
        return json.loads(self.run("manage.py", "xjobs", "show", job_id, "--json").stdout)


def clean_env() -> dict[str, str]:
    """This process's environment without what points a Python at this checkout, its test
    settings or its worker knobs: the project must stand on its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith("XJOBS_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def fresh_database_url(suffix: str) -> Iterator[str]:
    """The URL of a database of its own (named after this run's test database), dropped at the
    end."""
    import psycopg
    from django.conf import settings

    from tests import devdb

    name = f"{settings.DATABASES['default']['TEST']['NAME']}_{suffix}"
    server = os.environ["DATABASE_URL"]  # tests/settings.py sets it

    def admin(sql: str) -> None:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql)

    admin(f'drop database if exists "{name}" with (force)')
    admin(f'create database "{name}"')
    try:
        yield devdb.with_database(server, name)
    finally:
        admin(f'drop database if exists "{name}" with (force)')


@contextmanager
def fresh_database(suffix: str) -> Iterator[dict]:
    """:func:`fresh_database_url` as a ``DATABASES`` entry."""
    from tests import devdb

    with fresh_database_url(suffix) as url:
        yield devdb.settings_from_url(url)


def new_project(path: Path, python: str, database: dict) -> Project:
    (path / "shop").mkdir(parents=True)
    (path / "manage.py").write_text(MANAGE_PY)
    (path / "shop" / "__init__.py").write_text("")
    (path / "shop" / "settings.py").write_text(settings_py(database))
    (path / "shop" / "urls.py").write_text(URLS_PY)
    (path / "shop" / "jobs.py").write_text(JOBS_PY)
    return Project(path, python, clean_env(), database)


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


def test_the_wheel_holds_the_license_types_templates_static_files_and_migrations(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "django_xjobs"
    expected = {"django_xjobs/py.typed"}
    for tree in ("templates", "static", "migrations"):
        files = [p for p in (package / tree).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts]
        assert files, tree
        expected |= {f"django_xjobs/{p.relative_to(package)}" for p in files}
    assert expected <= names, sorted(expected - names)
    licenses = [n for n in names
                if re.fullmatch(r"django_xjobs-[^/]+\.dist-info/licenses/LICENSE", n)]
    assert licenses, sorted(n for n in names if ".dist-info/" in n)
    with zipfile.ZipFile(wheel) as zf:
        assert "MIT License" in zf.read(licenses[0]).decode()


def test_the_wheel_holds_the_package_and_nothing_of_the_checkouts_tools(wheel):
    # tests/devdb.py (the demo's, the suite's and bench/'s choice of database) is a tool of the
    # checkout: a user's project configures DATABASES itself.
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    (dist_info,) = [top for top in tops if top.endswith(".dist-info")]
    assert tops == {"django_xjobs", dist_info}, sorted(tops)
    assert (ROOT / "tests" / "devdb.py").is_file()
    assert not [name for name in names if name.rsplit("/", 1)[-1] == "devdb.py"]


def test_the_long_description_is_the_pip_users_page(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(meta).decode()
    headers, _, description = metadata.partition("\n\n")
    assert description.strip() == (ROOT / "docs/pypi.md").read_text().strip()
    assert "Description-Content-Type: text/markdown" in headers
    assert "License-Expression: MIT" in headers
    assert "Project-URL: Documentation, https://" in headers


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


def quickstart(project: Project, installed: str) -> None:
    where = project.run("-c", "import django_xjobs; print(django_xjobs.__file__)").stdout
    assert where.startswith(str(Path(installed).parent.parent)), where  # the wheel's copy

    project.run(*quickstart_command("manage.py migrate"), "--no-input")
    project.run("manage.py", "check", "--fail-level", "WARNING")
    job_id = project.enqueue("add.enqueue(a=1, b=2)")
    assert project.job(job_id)["state"] == "ready"
    project.run(*quickstart_command("manage.py xjobs_worker"), "--burst")
    job = project.job(job_id)
    assert (job["state"], job["result"]) == ("done", {"sum": 3})


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
