"""The package's types mean something (``py.typed``): mypy passes on the package, accepts the
documented calls of tests/typecheck/enqueue_calls.py and refuses its wrong ones with the errors
they name. ``make lint`` runs the same check.

mypy is in the ``dev`` extra; without it these tests skip and say so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[2]


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
             "--cache-dir", str(ROOT / ".mypy_cache"), *extra, *args],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )

    done = run()
    if "INTERNAL ERROR" in done.stdout + done.stderr:
        # mypy's own crash (seen once in CI, on a loaded machine), not a finding about the
        # code: once more, with the traceback that a report to mypy would need.
        done = run("--show-traceback")
    return done


def test_mypy_passes_on_the_package_and_on_the_calls_of_the_public_api():
    done = mypy(str(ROOT / "django_xjobs"), str(ROOT / "tests" / "typecheck"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


def test_a_wrong_argument_to_enqueue_is_a_type_error(tmp_path):
    # Some of enqueue_calls.py's refused calls, without their ignore comments.
    snippet = tmp_path / "bad_calls.py"
    snippet.write_text("\n".join([
        "from django_xjobs import JobContext, job",
        "@job",
        "def add(ctx: JobContext, a: int, b: int = 0) -> int:",
        "    return a + b",
        "add.enqueue(c=1)",
        "add.enqueue(b=1)",
        "add.using(tenant_id='acme').enqueue(a='one')",
        "add.using(dealy=5)",
    ]) + "\n")
    done = mypy(str(snippet))
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Unexpected keyword argument "c" for "enqueue" of "Job"' in done.stdout
    assert 'Missing positional argument "a" in call to "enqueue" of "Job"' in done.stdout
    assert ('Argument "a" to "enqueue" of "BoundJob" has incompatible type "str"; expected "int"'
            in done.stdout)
    assert 'Unexpected keyword argument "dealy" for "using" of "Job"' in done.stdout
    assert "Found 4 errors" in done.stdout
