"""What a release hands out, checked before it is tagged: ``make release`` runs this on the
sdist and the wheel ``python -m build`` left in ``dist/`` (docs/development.md, "Cutting a
release")::

    python -m tests.release_check dist/ [--django 5.2]

1. The wheel holds the package with its migrations, templates, static files, ``py.typed`` and
   the license, and nothing of the checkout's tools (``tests/``, ``example_project/``,
   ``bench/``, ``tests/devdb.py``); its metadata carries ``conf.VERSION`` and docs/pypi.md as
   the long description.
2. The sdist holds every file of the package and what its build needs (``pyproject.toml``,
   ``LICENSE``, docs/pypi.md). ``python -m build`` built the wheel from the sdist, not from the
   checkout, so a file the sdist lacked would be missing from the wheel too.
3. The wheel, installed by pip into a fresh virtualenv with its dependencies from the package
   index (the one thing of this check that needs the network: the dependencies a pip user
   gets, not this checkout's), runs the quickstart of docs/pypi.md in a new project, on a
   scratch database of the server ``tests/devdb.py`` picks: migrate, check, enqueue,
   ``xjobs_worker --burst``, the job done. The virtualenv and the database are removed after.

tests/acceptance/test_package.py runs items 1 and 3 on a wheel built offline in the suite; the
checks and the quickstart project are defined here, once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "django_xjobs"

STEP_TIMEOUT = 180  # seconds one command may take on a loaded machine: a bound, not a measure


class CommandFailed(AssertionError):
    """A command of the quickstart exited non-zero; the message has its output."""


# ---------------------------------------------------------------------------- the archives --


def package_files(*trees: str) -> set[str]:
    """The files of the checkout's ``django_xjobs/`` (or of its subdirectories ``trees``), as
    paths from the repository's root, without bytecode."""
    roots = [PACKAGE / tree for tree in trees] if trees else [PACKAGE]
    return {str(p.relative_to(ROOT)) for root in roots for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def version() -> str:
    """``conf.VERSION``, read from the file as setuptools reads it (no Django needed)."""
    found = re.search(r'^VERSION = "([^"]+)"$', (PACKAGE / "conf.py").read_text(), re.M)
    assert found, "django_xjobs/conf.py has no VERSION"
    return found.group(1)


def wheel_problems(wheel: Path) -> list[str]:
    """What is wrong with a built wheel; empty when nothing is."""
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        tops = {name.split("/")[0] for name in names}
        dist_infos = [top for top in tops if top.endswith(".dist-info")]
        if len(dist_infos) != 1:
            return [f"{wheel.name}: {len(dist_infos)} .dist-info directories: {sorted(tops)}"]
        (dist_info,) = dist_infos
        expected = package_files("templates", "static", "migrations") | {
            "django_xjobs/py.typed", "django_xjobs/__init__.py"}
        if missing := sorted(expected - names):
            problems.append(f"missing from the wheel: {missing}")
        # The checkout's tools (tests/, example_project/, bench/, tests/devdb.py: the demo's,
        # the suite's and bench/'s choice of database) are not the package: a user's project
        # configures DATABASES itself.
        if extra := sorted(tops - {"django_xjobs", dist_info}):
            problems.append(f"the wheel has top-level entries beside the package: {extra}")
        if devdb := [n for n in names if n.rsplit("/", 1)[-1] == "devdb.py"]:
            problems.append(f"the wheel carries the checkout's devdb.py: {devdb}")
        license_name = f"{dist_info}/licenses/LICENSE"
        if license_name not in names:
            problems.append(f"no {license_name}")
        elif "MIT License" not in zf.read(license_name).decode():
            problems.append(f"{license_name} is not the MIT license")
        headers, _, description = zf.read(f"{dist_info}/METADATA").decode().partition("\n\n")
    for header in (f"Version: {version()}", "Description-Content-Type: text/markdown",
                   "License-Expression: MIT", "Project-URL: Documentation, https://"):
        if header not in headers:
            problems.append(f"the wheel's METADATA lacks {header!r}")
    if description.strip() != (ROOT / "docs/pypi.md").read_text().strip():
        problems.append("the wheel's long description is not docs/pypi.md")
    if not wheel.name.startswith(f"django_xjobs-{version()}-"):
        problems.append(f"{wheel.name} is not named for version {version()}")
    return problems


def sdist_problems(sdist: Path) -> list[str]:
    """What is wrong with a built sdist; empty when nothing is."""
    top = f"django_xjobs-{version()}"
    with tarfile.open(sdist) as tf:
        names = {name.partition("/")[2] for name in tf.getnames() if name.startswith(top + "/")}
    if not names:
        return [f"{sdist.name}: nothing under {top}/"]
    needed = package_files() | {"pyproject.toml", "LICENSE", "README.md", "docs/pypi.md",
                                "PKG-INFO"}
    missing = sorted(needed - names)
    return [f"missing from the sdist: {missing}"] if missing else []


# -------------------------------------------------------------------- the quickstart project --

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
    """The line of docs/pypi.md that contains ``name``, without its comment: the check runs
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
            raise CommandFailed(f"{shlex.join(command)} exited {done.returncode}:\n"
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


def new_project(path: Path, python: str, database: dict) -> Project:
    (path / "shop").mkdir(parents=True)
    (path / "manage.py").write_text(MANAGE_PY)
    (path / "shop" / "__init__.py").write_text("")
    (path / "shop" / "settings.py").write_text(settings_py(database))
    (path / "shop" / "urls.py").write_text(URLS_PY)
    (path / "shop" / "jobs.py").write_text(JOBS_PY)
    return Project(path, python, clean_env(), database)


def quickstart(project: Project, installed: str) -> dict:
    """docs/pypi.md's quickstart in ``project``, run by the virtualenv python ``installed``:
    the job the worker finished (``xjobs show --json``)."""
    where = project.run("-c", "import django_xjobs; print(django_xjobs.__file__)").stdout
    venv = str(Path(installed).parent.parent)
    if not where.startswith(venv):  # the wheel's copy, not this checkout's
        raise CommandFailed(f"django_xjobs imported from {where.strip()}, not from {venv}")
    project.run(*quickstart_command("manage.py migrate"), "--no-input")
    project.run("manage.py", "check", "--fail-level", "WARNING")
    job_id = project.enqueue("add.enqueue(a=1, b=2)")
    if (state := project.job(job_id)["state"]) != "ready":
        raise CommandFailed(f"the enqueued job is {state}, not ready")
    project.run(*quickstart_command("manage.py xjobs_worker"), "--burst")
    job = project.job(job_id)
    if (job["state"], job["result"]) != ("done", {"sum": 3}):
        raise CommandFailed(f"after the burst the job is {job['state']}: {job}")
    return job


@contextmanager
def scratch_database_url(server: str, name: str) -> Iterator[str]:
    """The URL of a new database ``name`` on ``server`` (a URL), dropped at the end."""
    import psycopg

    from tests import devdb

    def admin(sql: str) -> None:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql)

    admin(f'drop database if exists "{name}" with (force)')
    admin(f'create database "{name}"')
    try:
        yield devdb.with_database(server, name)
    finally:
        admin(f'drop database if exists "{name}" with (force)')


# ------------------------------------------------------------------------------- make release --


def one(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        sys.exit(f"release check: {len(found)} files {pattern} in {directory}, not one "
                 f"(make release empties dist/ first)")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.release_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path, help="the directory python -m build wrote")
    parser.add_argument("--django", default="",
                        help="the Django series the fresh virtualenv gets (e.g. 5.2); "
                             "default: the newest pip picks")
    args = parser.parse_args(argv)
    wheel = one(args.dist, f"django_xjobs-{version()}-py3-none-any.whl")
    sdist = one(args.dist, f"django_xjobs-{version()}.tar.gz")
    problems = wheel_problems(wheel) + sdist_problems(sdist)
    for problem in problems:
        print(f"release check: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"release check: {wheel.name}: package, migrations, templates, static files, "
          f"py.typed, license, metadata; no tests/, example_project/, bench/")
    print(f"release check: {sdist.name}: every file of django_xjobs/ and what its build needs")

    from tests import devdb

    server, source = devdb.resolve()
    with tempfile.TemporaryDirectory(prefix="xjobs-release-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       timeout=STEP_TIMEOUT)
        python = str(venv / "bin" / "python")
        requirements = [str(wheel)] + ([f"Django=={args.django}.*"] if args.django else [])
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        *requirements], check=True, timeout=STEP_TIMEOUT * 3,
                       env=clean_env())
        installed = subprocess.run(
            [python, "-c", "import django, django_xjobs; "
                           "print(django_xjobs.__version__, django.get_version())"],
            check=True, capture_output=True, text=True, env=clean_env(), cwd=tmp,
        ).stdout.split()
        if installed[0] != version():
            print(f"release check: the virtualenv imports django_xjobs {installed[0]}, "
                  f"not {version()}", file=sys.stderr)
            return 1
        print(f"release check: {wheel.name} installed into a fresh virtualenv with its "
              f"dependencies from the index (Django {installed[1]})")
        with scratch_database_url(server, "xjobs_release_quickstart") as url:
            from tests.devdb import settings_from_url

            project = new_project(Path(tmp) / "shop", python, settings_from_url(url))
            try:
                job = quickstart(project, python)
            except CommandFailed as exc:
                print(f"release check: the quickstart failed: {exc}", file=sys.stderr)
                return 1
    print(f"release check: quickstart of docs/pypi.md in a new project on {source} "
          f"PostgreSQL: migrate, check, enqueue, xjobs_worker --burst -> job "
          f"{job['state']} {json.dumps(job['result'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
